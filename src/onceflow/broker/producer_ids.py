"""Producer id allocation that never hands out an id twice, even after a crash.

Ids are reserved in blocks: the end of the current block is fsynced to disk before any id
from it is used, so a restart continues after the block. In a cluster, blocks come from
ZooKeeper instead, shared by every broker; the next block is asked for off the event loop while
the current one still lasts, and a broker without an id in hand (ZooKeeper out of reach) says
so (`ready`) instead of waiting on it, as Kafka's RPCProducerIdManager answers
COORDINATOR_LOAD_IN_PROGRESS.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from onceflow.log.errors import LogLoadError
from onceflow.log_limits import once_per_interval

BLOCK_SIZE = 1000
# In a cluster, the next block is asked for once this few ids of the current one are left.
PREFETCH_WHEN_LEFT = BLOCK_SIZE // 5

_repeated = once_per_interval(__name__)


class ProducerIdsUnavailable(Exception):
    """No producer id in hand: the next block has not come from ZooKeeper yet."""


class ProducerIdAllocator:
    def __init__(self, data_dir: Path, reserve_block: Callable[[int], int] | None = None) -> None:
        """`reserve_block(size)` returns the first id of `size` ids nobody else gets (it may block
        for a round trip to ZooKeeper, so it runs on a thread); without it, blocks are reserved in
        a file of the data directory."""
        self._path = data_dir / "producer-id-block"
        self._reserve_block = reserve_block
        self._next = self._read_block_end() if reserve_block is None else 0
        self._block_end = self._next
        self._next_block: int | None = None  # the first id of a block reserved ahead
        self._reserving: asyncio.Future[int] | None = None

    def ready(self) -> bool:
        """Whether `allocate` can hand out an id now. In a cluster it also asks ZooKeeper for the
        next block, on a thread, once the current one runs low."""
        if self._reserve_block is None:
            return True
        left = self._block_end - self._next
        if left <= PREFETCH_WHEN_LEFT and self._next_block is None:
            self._reserve_ahead()
        return left > 0 or self._next_block is not None

    def allocate(self) -> int:
        if self._next >= self._block_end:
            if self._reserve_block is None:
                self._reserve(self._next + BLOCK_SIZE)
            elif self._next_block is not None:
                self._next, self._block_end = self._next_block, self._next_block + BLOCK_SIZE
                self._next_block = None
            else:
                self._reserve_ahead()
                raise ProducerIdsUnavailable("no producer id block from ZooKeeper yet")
        producer_id = self._next
        self._next += 1
        return producer_id

    def _reserve_ahead(self) -> None:
        if self._reserving is not None or self._reserve_block is None:
            return  # one at a time: a call stuck on an unreachable ZooKeeper is not repeated
        self._reserving = asyncio.get_running_loop().run_in_executor(None, self._reserve_block, BLOCK_SIZE)
        self._reserving.add_done_callback(self._reserved)

    def _reserved(self, reserving: asyncio.Future[int]) -> None:
        self._reserving = None
        if reserving.cancelled():
            return
        error = reserving.exception()
        if error is not None:
            _repeated.warning("reserving producer ids failed: %s; asked again on the next need", error)
            return
        self._next_block = reserving.result()

    def _read_block_end(self) -> int:
        if not self._path.exists():
            return 0
        try:
            return int(self._path.read_text())
        except ValueError as error:
            # Guessing could hand out an id a producer already has.
            raise LogLoadError(f"{self._path} is unreadable ({error}); restore it from a backup") from None

    def _reserve(self, block_end: int) -> None:
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w") as file:
            file.write(str(block_end))
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, self._path)
        self._block_end = block_end
