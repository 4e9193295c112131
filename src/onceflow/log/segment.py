"""One segment of a partition log: the `.log` file and its indexes (`index.py`,
`transaction_index.py`), plus the segment files' names and the cleaner's swaps."""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from onceflow.log.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    first_record_at_or_after,
    parse_batch_header,
)
from onceflow.log.errors import LogReadError
from onceflow.log.files import write_fully_vectored
from onceflow.log.index import OffsetIndex, TimeIndex, open_file
from onceflow.log.scan import CorruptRange, scan_batches, walk_batches
from onceflow.log.transaction_index import TransactionIndex

_log = logging.getLogger(__name__)


class FetchedBatches(NamedTuple):
    """What a read returns (Kafka's `FetchDataInfo`): whole batches and the offset after them."""

    records: bytes
    next_offset: int  # the offset after the last batch; meaningless when `records` is empty


NOTHING_FETCHED = FetchedBatches(b"", -1)
# The walk over stored batches reads only what it needs: base offset and length, and the
# last offset delta of the batches it looks for the fetch offset in.
_BASE_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
_MAGIC_AT = 16


def _batch_bounds(data: bytes, position: int) -> tuple[int, int]:
    """(base offset, size) of the stored batch at `position`."""
    base_offset, length = _BASE_OFFSET_AND_LENGTH.unpack_from(data, position)
    return base_offset, length + LOG_OVERHEAD


# How far past the index entry one read reaches to find the batch holding the fetch offset:
# entries are at most about `index.interval.bytes` (4 KiB by default) plus one batch apart.
_READ_AHEAD = 16 * 1024

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SEGMENT_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX)  # the .log last
# The log cleaner's temporary names (Kafka's): a cleaned segment is written as `.cleaned`
# files, renamed to `.swap` once fsynced (the .log last: it commits the swap), then renamed
# over the segment it replaces.
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

# Relative offsets and file positions are int32, as in Kafka's index formats.
MAX_RELATIVE_OFFSET = 2**31 - 1

_SCAN_CHUNK = 64 * 1024


def segment_path(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:020d}{suffix}"


class SegmentMark(NamedTuple):
    size: int
    next_offset: int
    max_timestamp: int
    bytes_since_index_entry: int


class LogSegment:
    """A `.log` file of consecutive batches starting at `base_offset`, plus its indexes.

    All mutation happens on one thread; `sync` may run on another thread at the same time,
    which is safe because it only fsyncs file descriptors that stay open until `close`.
    """

    def __init__(self, directory: Path, base_offset: int, truncate: bool, temporary: str = "") -> None:
        self.base_offset = base_offset
        self.log_path = segment_path(directory, base_offset, LOG_SUFFIX + temporary)
        self.txn_index = TransactionIndex(
            segment_path(directory, base_offset, TXN_INDEX_SUFFIX + temporary), truncate
        )
        # Three descriptors: when one cannot be had (EMFILE), the others are let go again.
        self.index = OffsetIndex(
            segment_path(directory, base_offset, INDEX_SUFFIX + temporary), base_offset, truncate
        )
        try:
            self.time_index = TimeIndex(
                segment_path(directory, base_offset, TIME_INDEX_SUFFIX + temporary), base_offset, truncate
            )
            try:
                self._fd = open_file(self.log_path, truncate)
            except OSError:
                self.time_index.close()
                raise
        except OSError:
            self.index.close()
            raise
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        self._bytes_since_index_entry = 0
        # What a roll by time counts from (`roll.py`): the first batch's max timestamp (read
        # when first asked for), else the time the segment was made or opened, as Kafka's.
        self._first_batch_timestamp: int | None = None
        self.created_ms = int(time.time() * 1000)
        self.roll_jitter_ms: int | None = None  # drawn at the first check, from segment.jitter.ms
        # Written by whichever thread runs `sync`.
        self.synced_size = 0
        self.truncations = 0  # a sync begun before one covers none of what follows it
        self.indexes_synced = False
        self.corrupt: list[CorruptRange] = []  # found by recovery, in file order

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> LogSegment:
        return cls(directory, base_offset, truncate=True)

    @classmethod
    def create_cleaned(cls, directory: Path, base_offset: int) -> LogSegment:
        """A segment under the cleaner's temporary names. Its .txnindex exists even when
        empty, so that a swap always replaces the old one."""
        segment = cls(directory, base_offset, truncate=True, temporary=CLEANED_SUFFIX)
        segment.txn_index.create()
        return segment

    @classmethod
    def open(cls, directory: Path, base_offset: int) -> LogSegment:
        """Open existing files; `recover` must run before the segment is used."""
        segment = cls(directory, base_offset, truncate=False)
        segment.txn_index.load()
        if not (segment.index.load() and segment.time_index.load()):
            segment.index.clear()
            segment.time_index.clear()
        return segment

    @property
    def fd(self) -> int:
        """The log file's descriptor, for an fdatasync run elsewhere (`PartitionLog.begin_data_flush`)."""
        return self._fd

    @property
    def largest_timestamp(self) -> int:
        """For time retention; batches without timestamps fall back to the file's mtime."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.fstat(self._fd).st_mtime * 1000)

    @property
    def first_batch_timestamp(self) -> int:
        """The first batch's max timestamp: -1 when it has none, or the segment is empty."""
        if self._first_batch_timestamp is None and self.size >= HEADER_SIZE:
            header = parse_batch_header(os.pread(self._fd, HEADER_SIZE, 0), 0)
            self._first_batch_timestamp = header.max_timestamp
        return -1 if self._first_batch_timestamp is None else self._first_batch_timestamp

    # -- recovery ---------------------------------------------------------------------------

    def recover(
        self, verify_from: int | None, index_interval_bytes: int, keep_corrupt: bool, keep_tail: bool = False
    ) -> int:
        """Re-read the tail of the segment, rebuild the index entries there, and cut off what a
        crash may have torn. Returns the number of bytes cut off.

        With `verify_from` None the segment is trusted (it was fsynced, or the broker stopped
        cleanly): only the batches after the last index entry are read, headers only, and
        nothing is cut. Otherwise every batch from the index entry at or before `verify_from` is
        read and its CRC checked, and the file is cut at the first bad batch at or after
        `verify_from`, unless `keep_corrupt` and an intact batch follows it (a byte gone bad,
        not a torn write), or `keep_tail` (a segment that later segments follow: a bad end of it
        is no torn write either). Corrupt stretches that are kept become `corrupt` ranges.
        """
        file_size = os.fstat(self._fd).st_size
        entry = self.index.last_entry() if verify_from is None else self.index.lookup(verify_from)
        start = entry[1] if entry else 0

        def keep(found: CorruptRange) -> bool:
            if verify_from is None or found.first_offset < verify_from:
                return True  # below the recovery point: fsynced, never repaired by deleting
            return keep_corrupt and (found.end_offset is not None or keep_tail)

        hints = list(self.index.positions)
        end = self._rescan(start, file_size, verify_from is not None, index_interval_bytes, keep, hints)
        if end is None:
            # The indexed batch is unreadable or beyond the end: the index cannot be trusted.
            end = self._rescan(0, file_size, verify_from is not None, index_interval_bytes, keep, [])
            assert end is not None
        for found in self.corrupt:
            _log.error(
                "%s: bytes %d to %d hold no readable batch (offsets from %d): kept, read as CORRUPT_MESSAGE",
                self.log_path,
                found.position,
                found.end_position,
                found.first_offset,
            )
        if end < file_size:
            _log.warning(
                "%s: truncating %d bytes of torn or corrupt data at position %d (offset %d)",
                self.log_path,
                file_size - end,
                end,
                self.next_offset,
            )
            os.ftruncate(self._fd, end)
        return file_size - end

    def end_corrupt_tail(self, end_offset: int) -> None:
        """A corrupt stretch that runs to the end of the file covers the offsets up to
        `end_offset` (the next segment's base, or the durable end of the log): new appends
        start there, indexed, so that no read walks through it."""
        if self.corrupt and self.corrupt[-1].end_offset is None:
            end_offset = max(end_offset, self.next_offset)
            self.corrupt[-1] = dataclasses.replace(self.corrupt[-1], end_offset=end_offset)
            self.next_offset = end_offset

    def truncate_to(self, offset: int, index_interval_bytes: int) -> None:
        """Cut the file before the first batch at or after `offset`, and its indexes with it."""
        # An entry before `offset`, whose batch ends at or before the cut: an entry for `offset`
        # itself would sit at the cut, where the rescan finds no batch and would leave this
        # segment's size and next offset as they were, past the cut (the next append then wrote
        # after a hole).
        entry = self.index.lookup(offset - 1)
        start = entry[1] if entry else 0
        position = next(
            (position for position, header in self._scan(start, self.size) if header.base_offset >= offset),
            self.size,
        )
        os.ftruncate(self._fd, position)
        self.corrupt = [found for found in self.corrupt if found.end_position <= start]
        if self._rescan(start, position, False, index_interval_bytes, lambda _: True, []) != position:
            raise OSError(f"{self.log_path}: cut at byte {position}, but its batches end at {self.size}")
        self.synced_size = min(self.synced_size, position)
        self.truncations += 1
        self.indexes_synced = False
        self.txn_index.truncate_to(offset)

    def _rescan(
        self,
        start: int,
        file_size: int,
        verify: bool,
        index_interval_bytes: int,
        keep: Callable[[CorruptRange], bool],
        hints: list[int],
    ) -> int | None:
        """Forget what is known past `start` (an indexed position or 0), then walk the
        batches from there, re-adding index entries and keeping the corrupt stretches `keep`
        accepts. Returns where the kept data ends, or None when `start` (past 0) holds no batch."""
        if start and start + HEADER_SIZE > file_size:
            return None
        self.index.truncate_to(start + 1 if start else 0)
        entry = self.index.last_entry()
        self.next_offset = entry[0] if entry else self.base_offset
        self.time_index.truncate_to(self.next_offset + 1 if entry else self.base_offset)
        self.max_timestamp = self.time_index.last_timestamp
        self._bytes_since_index_entry = 0
        self.size = start
        self.corrupt = [found for found in self.corrupt if found.end_position <= start]
        if start == 0:
            self._first_batch_timestamp = None
        for item in walk_batches(self._fd, start, file_size, self.next_offset, verify, hints):
            if isinstance(item, CorruptRange):
                if item.position == start and start > 0:
                    return None
                if not keep(item):
                    break
                self.corrupt.append(item)
                self.size = item.end_position
                # The batch after it starts an index entry: no read walks through it.
                self._bytes_since_index_entry = index_interval_bytes + 1
                continue
            position, header = item
            if header.last_offset - self.base_offset > MAX_RELATIVE_OFFSET:
                break
            self._track(header.base_offset, header.max_timestamp, position, header.size, index_interval_bytes)
            self.next_offset = header.last_offset + 1
            self.size = position + header.size
        return self.size

    # -- appending ----------------------------------------------------------------------------

    def append(
        self,
        pieces: list[bytes | bytearray | memoryview],
        headers: list[BatchHeader],
        base_offsets: list[int],
        index_interval_bytes: int,
    ) -> None:
        """Write batches at the end, in one system call: `pieces` are their bytes as stored
        (offsets assigned), in order. On an I/O error undo everything."""
        before = self.mark()
        try:
            write_fully_vectored(self._fd, pieces, before.size)
            position = before.size
            for header, base_offset in zip(headers, base_offsets, strict=True):
                self._track(base_offset, header.max_timestamp, position, header.size, index_interval_bytes)
                position += header.size
        except OSError:
            self.undo_append(before)
            raise
        self.next_offset = base_offsets[-1] + headers[-1].last_offset_delta + 1
        self.size = position

    def mark(self) -> SegmentMark:
        """Where the segment ends now, for `undo_append`."""
        return SegmentMark(self.size, self.next_offset, self.max_timestamp, self._bytes_since_index_entry)

    def undo_append(self, mark: SegmentMark) -> None:
        """Cut the segment back to `mark`, files and memory. Memory first: should the file not
        shrink (OSError), reads still end where they did, and the next append writes over it."""
        self.size, self.next_offset = mark.size, mark.next_offset
        self.max_timestamp, self._bytes_since_index_entry = mark.max_timestamp, mark.bytes_since_index_entry
        self.synced_size = min(self.synced_size, mark.size)
        self.index.truncate_to(mark.size)
        self.time_index.truncate_to(mark.next_offset)
        os.ftruncate(self._fd, mark.size)

    def _track(self, base_offset: int, max_timestamp: int, position: int, size: int, interval: int) -> None:
        """Index a batch once more than `interval` bytes were written since the last entry.
        The time index entry includes this batch, so every batch at or before its offset has
        a max timestamp no larger than the entry's."""
        self.max_timestamp = max(self.max_timestamp, max_timestamp)
        if position == 0:
            self._first_batch_timestamp = max_timestamp
        if self._bytes_since_index_entry > interval:
            self.index.append(base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, base_offset)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += size

    # -- reading ------------------------------------------------------------------------------

    def _scan(self, position: int, end: int, verify: bool = False) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the well-formed batches from `position` up to `end`, across the
        corrupt stretches (`scan_batches` between them)."""
        for found in self.corrupt:
            if found.end_position <= position:
                continue
            if found.position >= end:
                break
            yield from scan_batches(self._fd, position, min(found.position, end), verify)
            position = found.end_position
        yield from scan_batches(self._fd, position, end, verify)

    def batches(self) -> Iterator[tuple[BatchHeader, bytes]]:
        """Every batch with its bytes, in order (the cleaner reads closed segments this way)."""
        for position, header in self._scan(0, self.size):
            yield header, os.pread(self._fd, header.size, position)

    def batches_from(self, offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches whose last offset is at or after `offset`."""
        entry = self.index.lookup(offset)
        for _, header in self._scan(entry[1] if entry else 0, self.size):
            if header.last_offset >= offset:
                yield header

    def read(self, offset: int, max_bytes: int, max_offset: int) -> FetchedBatches:
        """Whole batches from the one containing `offset`, up to `max_bytes` but at least
        one, none starting at or after `max_offset`.

        One pread covers, in the common case, the way from the index entry to `offset` and
        the batches after it; the headers are walked once. A second read happens only when
        that way is longer than `_READ_AHEAD` or the first batch is bigger than `max_bytes`.
        """
        entry = self.index.lookup(offset)
        position = entry[1] if entry else 0
        size = self._readable_end(offset, position) if self.corrupt else self.size
        data = b""
        at = 0
        while True:  # to the first batch that holds `offset`
            if at + HEADER_SIZE > len(data):
                position += at
                if position + HEADER_SIZE > size:
                    return NOTHING_FETCHED
                data, at = os.pread(self._fd, min(max_bytes + _READ_AHEAD, size - position), position), 0
            base_offset, batch_size = _batch_bounds(data, at)
            if position + at + batch_size > size or data[at + _MAGIC_AT] != MAGIC or batch_size < HEADER_SIZE:
                # Every batch appended is whole: this one's header went bad since (a trusted
                # segment is not scanned at start-up, as in Kafka).
                raise LogReadError(
                    ErrorCode.corrupt_message,
                    f"the batch at byte {position + at} of {self.log_path.name} does not read "
                    f"(reading offset {offset})",
                )
            if base_offset + _LAST_OFFSET_DELTA.unpack_from(data, at + _LAST_OFFSET_DELTA_AT)[0] >= offset:
                break
            at += batch_size
        if base_offset >= max_offset:
            return NOTHING_FETCHED
        # KIP-74: the first batch goes out whole even when bigger than max_bytes.
        wanted = min(max(max_bytes, batch_size), size - position - at)
        if len(data) - at < wanted:
            position += at
            data, at = os.pread(self._fd, wanted, position), 0
        start, cap = at, at + wanted
        last, end = at, at + batch_size
        while end + HEADER_SIZE <= cap:
            base_offset, batch_size = _batch_bounds(data, end)
            if base_offset >= max_offset or end + batch_size > cap:
                break
            last, end = end, end + batch_size
        records = data if start == 0 and end == len(data) else data[start:end]
        return FetchedBatches(records, parse_batch_header(data, last).last_offset + 1)

    def _readable_end(self, offset: int, position: int) -> int:
        """Where a read from `position` for `offset` must stop: at the first corrupt stretch
        after it. CORRUPT_MESSAGE when `offset` lies in one."""
        end = self.size
        for found in self.corrupt:
            if found.holds(offset):
                raise LogReadError(
                    ErrorCode.corrupt_message,
                    f"offset {offset} lies in bytes {found.position}-{found.end_position} of "
                    f"{self.log_path.name}, which hold no readable batch",
                )
            if found.position >= position:
                end = min(end, found.position)
        return end

    def find_timestamp(self, timestamp: int, min_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `min_offset` (the log start)
        whose timestamp is at least `timestamp`, found through the time index and then record
        by record in the first batch whose max timestamp reaches it."""
        offset = self.time_index.offset_before(timestamp)
        entry = self.index.lookup(max(offset, min_offset)) if offset is not None else None
        for position, header in self._scan(entry[1] if entry else 0, self.size):
            if header.max_timestamp >= timestamp and header.last_offset >= min_offset:
                batch = os.pread(self._fd, header.size, position)
                found = first_record_at_or_after(batch, timestamp, min_offset)
                if found is not None:
                    return found
        return None

    # -- durability and lifetime --------------------------------------------------------------

    def sync(self, with_indexes: bool) -> None:
        """fsync the log. Indexes are only synced once final (segment rolled, or log closing):
        they can be rebuilt from the log anyway. The transaction index cannot, so it goes first."""
        # The count before the size (a truncation cuts the size, then counts): appends made
        # after a truncation counted later may be missing from this sync, so it then records none.
        truncations = self.truncations
        size = self.size
        self.txn_index.sync()
        os.fdatasync(self._fd)  # data and size; the other metadata need not be durable
        self.record_synced(size, truncations)
        if with_indexes and not self.indexes_synced:
            self.index.sync()
            self.time_index.sync()
            self.indexes_synced = True

    def record_synced(self, size: int, truncations: int) -> None:
        """An fdatasync begun when the file held `size` bytes, after `truncations` truncations,
        has ended. Bytes a truncation since then let be written again may not be in it."""
        if truncations == self.truncations:
            self.synced_size = max(self.synced_size, size)

    def needs_sync(self, with_indexes: bool) -> bool:
        return (
            self.synced_size < self.size or self.txn_index.dirty or (with_indexes and not self.indexes_synced)
        )

    def close(self) -> None:
        os.close(self._fd)
        self.index.close()
        self.time_index.close()
        self.txn_index.close()

    def delete_files(self) -> None:
        # The .log goes first: an index without its log is cleaned up when the log is opened.
        for path in (self.log_path, self.index.path, self.time_index.path, self.txn_index.path):
            path.unlink(missing_ok=True)


def rename_files(directory: Path, base_offset: int, old: str, new: str) -> None:
    """Rename a segment's files from one temporary suffix to another ("" for the real names),
    the .log last; `os.replace` makes each rename atomic."""
    for suffix in SEGMENT_SUFFIXES:
        source = segment_path(directory, base_offset, suffix + old)
        if source.exists():
            os.replace(source, segment_path(directory, base_offset, suffix + new))


def finish_interrupted_cleaning(directory: Path) -> int:
    """After a crash, as Kafka's log loader does: a `.log.swap` means the cleaned segment was
    complete and fsynced, so the swap is finished; any other `.cleaned` or `.swap` file is
    a clean that had not reached that point, and is deleted. Returns how many swaps finished."""
    swaps = sorted(directory.glob(f"*{LOG_SUFFIX}{SWAP_SUFFIX}"))
    for swap in swaps:
        base_offset = int(swap.name[: -len(LOG_SUFFIX + SWAP_SUFFIX)])
        _log.warning("%s: finishing a log cleaner swap interrupted by a crash", swap)
        rename_files(directory, base_offset, SWAP_SUFFIX, "")
    leftovers = [*directory.glob(f"*{CLEANED_SUFFIX}"), *directory.glob(f"*{SWAP_SUFFIX}")]
    for leftover in leftovers:
        leftover.unlink()
    return len(swaps)
