"""Producer id allocation that never hands out an id twice, even after a crash.

Ids are reserved in blocks: the end of the current block is fsynced to disk
before any id from it is used, so a restart continues after the block. In a
cluster, blocks come from ZooKeeper instead, shared by every broker.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

BLOCK_SIZE = 1000


class ProducerIdAllocator:
    def __init__(self, data_dir: Path, reserve_block: Callable[[int], int] | None = None) -> None:
        """`reserve_block(size)` returns the first id of `size` ids nobody else gets; without it,
        blocks are reserved in a file of the data directory."""
        self._path = data_dir / "producer-id-block"
        self._reserve_block = reserve_block
        self._next = int(self._path.read_text()) if self._path.exists() and reserve_block is None else 0
        self._block_end = self._next

    def allocate(self) -> int:
        if self._next >= self._block_end and self._reserve_block is not None:
            self._next = self._reserve_block(BLOCK_SIZE)
            self._block_end = self._next + BLOCK_SIZE
        elif self._next >= self._block_end:
            self._reserve(self._next + BLOCK_SIZE)
        producer_id = self._next
        self._next += 1
        return producer_id

    def _reserve(self, block_end: int) -> None:
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w") as file:
            file.write(str(block_end))
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, self._path)
        self._block_end = block_end
