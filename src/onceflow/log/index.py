"""A segment's indexes on one base (Kafka's `AbstractIndex`): the sparse offset index and the
time index here, the transaction index in `transaction_index.py`.

Entries live in `array.array`s (a few bytes each) and are written through to their files as
they are added. The offset and time indexes are not fsynced on the append path: after a crash
they are checked when loaded and rebuilt from the log when they do not make sense.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice
from pathlib import Path

from onceflow.log.files import write_fully

__all__ = ["IndexFile", "OffsetIndex", "TimeIndex"]

# Index files are big-endian like Kafka's; arrays hold native ints.
_SWAP_BYTES = sys.byteorder == "little"
_OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position
_TIME_ENTRY = struct.Struct(">qi")  # max timestamp so far, relative offset


def open_file(path: Path, truncate: bool) -> int:
    flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    return os.open(path, flags, 0o644)


class IndexFile:
    """What every index shares: its file, opened at once or (`lazy`) on the first write,
    fsynced and closed with the segment."""

    def __init__(self, path: Path, truncate: bool, lazy: bool = False) -> None:
        self.path = path
        self._fd: int | None = None
        if lazy:
            if truncate:
                path.unlink(missing_ok=True)
        else:
            self._fd = open_file(path, truncate)

    def _file(self) -> int:
        if self._fd is None:
            self._fd = open_file(self.path, truncate=False)
        return self._fd

    def _read_all(self) -> bytes:
        fd = self._file()
        return os.pread(fd, os.fstat(fd).st_size, 0)

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _strictly_increasing(values: array[int]) -> bool:
    return all(a < b for a, b in zip(values, islice(values, 1, None), strict=False))


class OffsetIndex(IndexFile):
    """Sparse map from offset to the file position of the batch that starts there."""

    ENTRY_SIZE = _OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int, truncate: bool) -> None:
        super().__init__(path, truncate)
        self.base_offset = base_offset
        self.relative_offsets = array("i")
        self.positions = array("i")

    def __len__(self) -> int:
        return len(self.positions)

    def load(self) -> bool:
        """Read the file; False (and an empty index) when it is not a plausible index."""
        data = self._read_all()
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
        write_fully(self._file(), _OFFSET_ENTRY.pack(relative, position), len(self) * self.ENTRY_SIZE)
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
        os.ftruncate(self._file(), keep * self.ENTRY_SIZE)

    def clear(self) -> None:
        self.truncate_to(0)


class TimeIndex(IndexFile):
    """Sparse map from the segment's running max timestamp to the offset where it was reached."""

    ENTRY_SIZE = _TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int, truncate: bool) -> None:
        super().__init__(path, truncate)
        self.base_offset = base_offset
        self.timestamps = array("q")
        self.relative_offsets = array("i")

    def __len__(self) -> int:
        return len(self.timestamps)

    def load(self) -> bool:
        """Read the file; False (and an empty index) when it is not a plausible index."""
        data = self._read_all()
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
        write_fully(self._file(), _TIME_ENTRY.pack(timestamp, relative), len(self) * self.ENTRY_SIZE)
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
        os.ftruncate(self._file(), keep * self.ENTRY_SIZE)

    def clear(self) -> None:
        self.truncate_to(self.base_offset)
