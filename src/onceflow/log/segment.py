"""One segment of a partition log: the `.log` file, its sparse offset and time indexes, and
the index of transactions aborted in it.

Index entries live in `array.array`s (a few bytes each) and are written through to their
files as they are added. Index files are not fsynced on the append path: after a crash they
are checked when loaded and rebuilt from the log when they do not make sense.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from onceflow.log.batch import (
    HEADER_SIZE,
    BatchHeader,
    CorruptRecordError,
    batch_crc_matches,
    first_record_at_or_after,
    parse_batch_header,
)
from onceflow.log.files import write_fully

_log = logging.getLogger(__name__)

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

# Index files are big-endian like Kafka's; arrays hold native ints.
_SWAP_BYTES = sys.byteorder == "little"
_OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position
_TIME_ENTRY = struct.Struct(">qi")  # max timestamp so far, relative offset
# Kafka's .txnindex entry: version, producer id, first offset, last offset, last stable offset
_ABORTED_ENTRY = struct.Struct(">hqqqq")
_SCAN_CHUNK = 64 * 1024


def segment_path(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:020d}{suffix}"


def _strictly_increasing(values: array[int]) -> bool:
    return all(a < b for a, b in zip(values, islice(values, 1, None), strict=False))


def _open_file(path: Path, truncate: bool) -> int:
    flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    return os.open(path, flags, 0o644)


class OffsetIndex:
    """Sparse map from offset to the file position of the batch that starts there."""

    ENTRY_SIZE = _OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int, truncate: bool) -> None:
        self.path = path
        self.base_offset = base_offset
        self.relative_offsets = array("i")
        self.positions = array("i")
        self._fd = _open_file(path, truncate)

    def __len__(self) -> int:
        return len(self.positions)

    def load(self) -> bool:
        """Read the file; False (and an empty index) when it is not a plausible index."""
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        if len(data) % self.ENTRY_SIZE:
            self.clear()
            return False
        pairs = array("i")
        pairs.frombytes(data)
        if _SWAP_BYTES:
            pairs.byteswap()
        self.relative_offsets = pairs[0::2]
        self.positions = pairs[1::2]
        # The batch at position 0 is never indexed, so a zero entry is a torn write.
        plausible = not pairs or (
            self.relative_offsets[0] > 0
            and self.positions[0] > 0
            and _strictly_increasing(self.relative_offsets)
            and _strictly_increasing(self.positions)
        )
        if not plausible:
            self.clear()
        return plausible

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        write_fully(self._fd, _OFFSET_ENTRY.pack(relative, position), len(self) * self.ENTRY_SIZE)
        self.relative_offsets.append(relative)
        self.positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int] | None:
        """The last entry (offset, position) at or before `offset`."""
        i = bisect_right(self.relative_offsets, offset - self.base_offset) - 1
        if i < 0:
            return None
        return self.base_offset + self.relative_offsets[i], self.positions[i]

    def last_entry(self) -> tuple[int, int] | None:
        if not self.positions:
            return None
        return self.base_offset + self.relative_offsets[-1], self.positions[-1]

    def truncate_to(self, position: int) -> None:
        """Drop the entries at or after `position`."""
        keep = bisect_left(self.positions, position)
        del self.relative_offsets[keep:]
        del self.positions[keep:]
        os.ftruncate(self._fd, keep * self.ENTRY_SIZE)

    def clear(self) -> None:
        self.truncate_to(0)

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


class TimeIndex:
    """Sparse map from the segment's running max timestamp to the offset where it was reached."""

    ENTRY_SIZE = _TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int, truncate: bool) -> None:
        self.path = path
        self.base_offset = base_offset
        self.timestamps = array("q")
        self.relative_offsets = array("i")
        self._fd = _open_file(path, truncate)

    def __len__(self) -> int:
        return len(self.timestamps)

    def load(self) -> bool:
        """Read the file; False (and an empty index) when it is not a plausible index."""
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        if len(data) % self.ENTRY_SIZE:
            self.clear()
            return False
        for timestamp, relative in _TIME_ENTRY.iter_unpack(data):
            self.timestamps.append(timestamp)
            self.relative_offsets.append(relative)
        plausible = (
            _strictly_increasing(self.timestamps)
            and _strictly_increasing(self.relative_offsets)
            and (not self.relative_offsets or self.relative_offsets[0] > 0)
        )
        if not plausible:
            self.clear()
        return plausible

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def maybe_append(self, timestamp: int, offset: int) -> None:
        if timestamp <= self.last_timestamp:
            return
        relative = offset - self.base_offset
        write_fully(self._fd, _TIME_ENTRY.pack(timestamp, relative), len(self) * self.ENTRY_SIZE)
        self.timestamps.append(timestamp)
        self.relative_offsets.append(relative)

    def offset_before(self, timestamp: int) -> int | None:
        """The offset of the last entry whose timestamp is below `timestamp`: every batch
        starting at or before it has a max timestamp below `timestamp` too."""
        i = bisect_left(self.timestamps, timestamp) - 1
        if i < 0:
            return None
        return self.base_offset + self.relative_offsets[i]

    def truncate_to(self, offset: int) -> None:
        """Drop the entries at or after `offset`."""
        keep = bisect_left(self.relative_offsets, offset - self.base_offset)
        del self.timestamps[keep:]
        del self.relative_offsets[keep:]
        os.ftruncate(self._fd, keep * self.ENTRY_SIZE)

    def clear(self) -> None:
        self.truncate_to(self.base_offset)

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int
    last_offset: int  # the offset of its ABORT marker
    last_stable_offset: int  # the partition's LSO right after the marker


class TransactionIndex:
    """The transactions whose ABORT marker landed in this segment (Kafka's `.txnindex`).

    The file exists only once a segment has an entry. It is fsynced before the log, so a
    durable marker always has its entry; an entry whose marker was lost is dropped on open.
    """

    def __init__(self, path: Path, truncate: bool) -> None:
        self.path = path
        self.entries: list[AbortedTransaction] = []
        self._fd: int | None = None
        self.dirty = False
        if truncate:
            path.unlink(missing_ok=True)

    def load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        whole = len(data) - len(data) % _ABORTED_ENTRY.size  # a torn last entry is dropped
        self.entries = [
            AbortedTransaction(*fields[1:]) for fields in _ABORTED_ENTRY.iter_unpack(data[:whole])
        ]
        if whole != len(data):
            self._rewrite()

    def create(self) -> None:
        self._file()
        self.dirty = True

    def append(self, entry: AbortedTransaction) -> None:
        self.entries.append(entry)
        write_fully(self._file(), _encode_aborted(entry), (len(self.entries) - 1) * _ABORTED_ENTRY.size)
        self.dirty = True

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after `offset`."""
        kept = [entry for entry in self.entries if entry.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    def sync(self) -> None:
        if self._fd is not None and self.dirty:
            # Cleared before the fsync: an entry the event loop appends while it runs must
            # leave the index dirty for the next sync.
            self.dirty = False
            try:
                os.fsync(self._fd)
            except BaseException:
                self.dirty = True
                raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _file(self) -> int:
        if self._fd is None:
            self._fd = _open_file(self.path, truncate=False)
        return self._fd

    def _rewrite(self) -> None:
        fd = self._file()
        os.ftruncate(fd, 0)
        write_fully(fd, b"".join(_encode_aborted(entry) for entry in self.entries), 0)
        self.dirty = True


def _encode_aborted(entry: AbortedTransaction) -> bytes:
    return _ABORTED_ENTRY.pack(
        0, entry.producer_id, entry.first_offset, entry.last_offset, entry.last_stable_offset
    )


class LogSegment:
    """A `.log` file of consecutive batches starting at `base_offset`, plus its indexes.

    All mutation happens on one thread; `sync` may run on another thread at the same time,
    which is safe because it only fsyncs file descriptors that stay open until `close`.
    """

    def __init__(self, directory: Path, base_offset: int, truncate: bool, temporary: str = "") -> None:
        self.base_offset = base_offset
        self.log_path = segment_path(directory, base_offset, LOG_SUFFIX + temporary)
        self.index = OffsetIndex(
            segment_path(directory, base_offset, INDEX_SUFFIX + temporary), base_offset, truncate
        )
        self.time_index = TimeIndex(
            segment_path(directory, base_offset, TIME_INDEX_SUFFIX + temporary), base_offset, truncate
        )
        self.txn_index = TransactionIndex(
            segment_path(directory, base_offset, TXN_INDEX_SUFFIX + temporary), truncate
        )
        self._fd = _open_file(self.log_path, truncate)
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        self._bytes_since_index_entry = 0
        # Written by whichever thread runs `sync`.
        self.synced_size = 0
        self.indexes_synced = False

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
    def largest_timestamp(self) -> int:
        """For time retention; batches without timestamps fall back to the file's mtime."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.fstat(self._fd).st_mtime * 1000)

    # -- recovery ---------------------------------------------------------------------------

    def recover(self, verify_from: int | None, index_interval_bytes: int) -> int:
        """Re-read the tail of the segment, rebuild the index entries there and truncate
        the file at the first torn or corrupt batch. Returns the number of bytes cut off.

        With `verify_from` None the segment is trusted (it was fsynced): only the batches
        after the last index entry are read, headers only. Otherwise every batch from the
        index entry at or before `verify_from` is read and its CRC checked.
        """
        file_size = os.fstat(self._fd).st_size
        verify = verify_from is not None
        entry = self.index.last_entry() if verify_from is None else self.index.lookup(verify_from)
        start = entry[1] if entry else 0
        end = self._rescan(start, file_size, verify, index_interval_bytes)
        if end == start and start > 0:
            # The indexed batch is unreadable or beyond the end: the index cannot be trusted.
            end = self._rescan(0, file_size, verify, index_interval_bytes)
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

    def truncate_to(self, offset: int, index_interval_bytes: int) -> None:
        """Cut the file before the first batch at or after `offset`, and its indexes with it."""
        entry = self.index.lookup(offset)
        start = entry[1] if entry else 0
        position = next(
            (position for position, header in self._scan(start, self.size) if header.base_offset >= offset),
            self.size,
        )
        os.ftruncate(self._fd, position)
        self._rescan(start, position, False, index_interval_bytes)
        self.synced_size = min(self.synced_size, position)
        self.indexes_synced = False
        self.txn_index.truncate_to(offset)

    def _rescan(self, start: int, file_size: int, verify: bool, index_interval_bytes: int) -> int:
        """Forget what is known past `start` (an indexed position or 0), then walk the
        batches from there, re-adding index entries. Returns where the valid batches end."""
        self.index.truncate_to(start + 1 if start else 0)
        entry = self.index.last_entry()
        self.next_offset = entry[0] if entry else self.base_offset
        self.time_index.truncate_to(self.next_offset + 1 if entry else self.base_offset)
        self.max_timestamp = self.time_index.last_timestamp
        self._bytes_since_index_entry = 0
        self.size = start
        for position, header in self._scan(start, file_size, verify):
            relative_last = header.last_offset - self.base_offset
            # Offsets only grow; a cleaned segment has gaps where records were removed.
            if header.base_offset < self.next_offset or relative_last > MAX_RELATIVE_OFFSET:
                break
            self._track(header.base_offset, header.max_timestamp, position, header.size, index_interval_bytes)
            self.next_offset = header.last_offset + 1
            self.size = position + header.size
        return self.size

    # -- appending ----------------------------------------------------------------------------

    def append(
        self,
        records: bytes | bytearray,
        headers: list[BatchHeader],
        base_offsets: list[int],
        index_interval_bytes: int,
    ) -> None:
        """Write already offset-patched batches at the end; on an I/O error undo everything."""
        start, start_offset = self.size, self.next_offset
        saved = (self.max_timestamp, self._bytes_since_index_entry)
        try:
            write_fully(self._fd, records, start)
            position = start
            for header, base_offset in zip(headers, base_offsets, strict=True):
                self._track(base_offset, header.max_timestamp, position, header.size, index_interval_bytes)
                position += header.size
        except OSError:
            os.ftruncate(self._fd, start)
            self.index.truncate_to(start)
            self.time_index.truncate_to(start_offset)
            self.max_timestamp, self._bytes_since_index_entry = saved
            raise
        self.next_offset = base_offsets[-1] + headers[-1].last_offset_delta + 1
        self.size = position

    def _track(self, base_offset: int, max_timestamp: int, position: int, size: int, interval: int) -> None:
        """Index a batch once more than `interval` bytes were written since the last entry.
        The time index entry includes this batch, so every batch at or before its offset has
        a max timestamp no larger than the entry's."""
        self.max_timestamp = max(self.max_timestamp, max_timestamp)
        if self._bytes_since_index_entry > interval:
            self.index.append(base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, base_offset)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += size

    # -- reading ------------------------------------------------------------------------------

    def _scan(self, position: int, end: int, verify: bool = False) -> Iterator[tuple[int, BatchHeader]]:
        """Yield (position, header) of the well-formed batches from `position` up to `end`,
        stopping silently at the first truncated or malformed one (or, when `verify`, at the
        first CRC mismatch). Reads in chunks so that small batches cost no syscall each."""
        buf = b""
        buf_start = position
        read_size = _SCAN_CHUNK
        while position + HEADER_SIZE <= end:
            at = position - buf_start
            if at + HEADER_SIZE > len(buf):
                buf = os.pread(self._fd, min(read_size, end - position), position)
                buf_start, at = position, 0
            try:
                header = parse_batch_header(buf, at)
            except CorruptRecordError:
                return
            if position + header.size > end:
                return
            if verify:
                if at + header.size > len(buf):
                    buf = os.pread(self._fd, min(max(header.size, _SCAN_CHUNK), end - position), position)
                    buf_start, at = position, 0
                if not batch_crc_matches(buf, at, header):
                    return
            # After a batch bigger than a chunk, reading a whole chunk for the next header
            # would mostly fetch body bytes that a header-only scan skips.
            read_size = HEADER_SIZE if header.size > _SCAN_CHUNK and not verify else _SCAN_CHUNK
            yield position, header
            position += header.size

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

    def read(self, offset: int, max_bytes: int, max_offset: int) -> bytes:
        """Whole batches from the one containing `offset`, up to `max_bytes` but at least
        one, none starting at or after `max_offset`."""
        entry = self.index.lookup(offset)
        batches = self._scan(entry[1] if entry else 0, self.size)
        first = next(((p, h) for p, h in batches if h.last_offset >= offset), None)
        if first is None or first[1].base_offset >= max_offset:
            return b""
        start, header = first
        data = os.pread(self._fd, min(max(max_bytes, header.size), self.size - start), start)
        end = header.size
        while end + HEADER_SIZE <= len(data):
            header = parse_batch_header(data, end)
            if header.base_offset >= max_offset or end + header.size > len(data):
                break
            end += header.size
        return data if end == len(data) else data[:end]

    def find_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp is at least `timestamp`,
        found through the time index and then record by record in the first batch whose
        max timestamp reaches it."""
        offset = self.time_index.offset_before(timestamp)
        entry = self.index.lookup(offset) if offset is not None else None
        for position, header in self._scan(entry[1] if entry else 0, self.size):
            if header.max_timestamp >= timestamp:
                batch = os.pread(self._fd, header.size, position)
                found = first_record_at_or_after(batch, timestamp)
                if found is not None:
                    return found
        return None

    # -- durability and lifetime --------------------------------------------------------------

    def sync(self, size: int, with_indexes: bool) -> None:
        """fsync the log, known to hold at least `size` bytes. Indexes are only synced once
        final (segment rolled, or log closing): they can be rebuilt from the log anyway. The
        transaction index cannot, so it goes first."""
        self.txn_index.sync()
        os.fdatasync(self._fd)  # data and size; the other metadata need not be durable
        self.synced_size = max(self.synced_size, size)
        if with_indexes and not self.indexes_synced:
            self.index.sync()
            self.time_index.sync()
            self.indexes_synced = True

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
