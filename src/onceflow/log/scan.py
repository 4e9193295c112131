"""Walking the batches of a segment file, and across the corrupt stretches in it.

A batch that does not parse, or whose CRC fails when checked, either ends the data (a torn
write at the end of a log, which recovery cuts) or sits between intact batches (a byte gone bad
in a segment that was fsynced long ago). `walk_batches` tells the two apart by looking for the
next intact batch: where its length says it ends, or at a position the offset index named.
Recovery keeps what is around a corrupt stretch and remembers it as a `CorruptRange`, which
reads answer with CORRUPT_MESSAGE; `onceflow log check` lists them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from onceflow.log.batch import (
    HEADER_SIZE,
    BatchHeader,
    CorruptRecordError,
    batch_crc_matches,
    parse_batch_header,
)

__all__ = ["CorruptRange", "scan_batches", "walk_batches"]

_SCAN_CHUNK = 64 * 1024
_BATCH_LENGTH = struct.Struct(">i")
_LENGTH_AT = 8
_LOG_OVERHEAD = 12


@dataclass(frozen=True, slots=True)
class CorruptRange:
    """Bytes of a segment that hold no readable batch, between intact ones."""

    position: int
    end_position: int  # where the next intact batch starts, or the end of the file
    first_offset: int  # the offset after the last intact batch before it
    end_offset: int | None  # the base offset of the next intact batch; None: unknown, to the end

    def holds(self, offset: int) -> bool:
        return self.first_offset <= offset and (self.end_offset is None or offset < self.end_offset)


def scan_batches(fd: int, position: int, end: int, verify: bool = False) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of the well-formed batches from `position` up to `end`,
    stopping silently at the first truncated or malformed one (or, when `verify`, at the first
    CRC mismatch). Reads in chunks so that small batches cost no system call each."""
    buf = b""
    buf_start = position
    read_size = _SCAN_CHUNK
    while position + HEADER_SIZE <= end:
        at = position - buf_start
        if at + HEADER_SIZE > len(buf):
            buf = os.pread(fd, min(read_size, end - position), position)
            buf_start, at = position, 0
        try:
            header = parse_batch_header(buf, at)
        except CorruptRecordError:
            return
        if position + header.size > end:
            return
        if verify:
            if at + header.size > len(buf):
                buf = os.pread(fd, min(max(header.size, _SCAN_CHUNK), end - position), position)
                buf_start, at = position, 0
            if not batch_crc_matches(buf, at, header):
                return
        # After a batch bigger than a chunk, reading a whole chunk for the next header would
        # mostly fetch body bytes that a header-only scan skips.
        read_size = HEADER_SIZE if header.size > _SCAN_CHUNK and not verify else _SCAN_CHUNK
        yield position, header
        position += header.size


def walk_batches(
    fd: int, start: int, end: int, first_offset: int, verify: bool, hints: Iterable[int] = ()
) -> Iterator[tuple[int, BatchHeader] | CorruptRange]:
    """The intact batches from `start` to `end`, and a CorruptRange for each stretch between
    them that holds none; one that reaches `end` is the last thing yielded. `first_offset`: the
    offset the walk expects first; `hints`: positions known to start batches (the old offset
    index's). Resumed batches are always CRC-checked, so that garbage is never taken for one."""
    positions = sorted(hints)
    position, next_offset = start, first_offset
    while position < end:
        stopped = position  # where the intact batches from `position` end
        for batch_position, header in scan_batches(fd, position, end, verify):
            if header.base_offset < next_offset:  # offsets only grow: this is no batch of ours
                break
            yield batch_position, header
            next_offset = header.last_offset + 1
            stopped = batch_position + header.size
        if stopped >= end:
            return
        resume = _next_intact(fd, stopped, end, next_offset, positions)
        if resume is None:
            yield CorruptRange(stopped, end, next_offset, None)
            return
        position, header = resume
        yield CorruptRange(stopped, position, next_offset, header.base_offset)


def _next_intact(
    fd: int, position: int, end: int, next_offset: int, hints: list[int]
) -> tuple[int, BatchHeader] | None:
    """The first intact batch after the bad one at `position`: where the bad one's length says
    it ends, or at a hinted position past it."""
    candidates = []
    raw = os.pread(fd, _LOG_OVERHEAD, position)
    if len(raw) == _LOG_OVERHEAD:
        (length,) = _BATCH_LENGTH.unpack_from(raw, _LENGTH_AT)
        if length >= HEADER_SIZE - _LOG_OVERHEAD and position + _LOG_OVERHEAD + length < end:
            candidates.append(position + _LOG_OVERHEAD + length)
    candidates += [hint for hint in hints if position < hint < end]
    for candidate in sorted(set(candidates)):
        found = _intact_batch_at(fd, candidate, end)
        if found is not None and found.base_offset >= next_offset:
            return candidate, found
    return None


def _intact_batch_at(fd: int, position: int, end: int) -> BatchHeader | None:
    head = os.pread(fd, HEADER_SIZE, position)
    try:
        header = parse_batch_header(head)
    except CorruptRecordError:
        return None
    if position + header.size > end:
        return None
    batch = os.pread(fd, header.size, position)
    return header if batch_crc_matches(batch, 0, header) else None
