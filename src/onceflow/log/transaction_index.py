"""The transactions aborted in a segment (Kafka's `.txnindex`) and how an ABORT marker becomes
an entry there."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from onceflow.log.batch import control_batch_is_commit
from onceflow.log.files import write_fully
from onceflow.log.index import IndexFile
from onceflow.log.producer_state import CompletedTransaction

__all__ = ["AbortedTransaction", "TransactionIndex", "aborted_entry"]

# Kafka's .txnindex entry: version, producer id, first offset, last offset, last stable offset
_ABORTED_ENTRY = struct.Struct(">hqqqq")


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int
    last_offset: int  # the offset of its ABORT marker
    last_stable_offset: int  # the partition's LSO right after the marker


def aborted_entry(
    completed: CompletedTransaction, marker: bytes | bytearray | memoryview, unstable: int | None
) -> AbortedTransaction | None:
    """The index entry of a transaction its marker just ended (None for a COMMIT); `unstable`
    is the partition's first unstable offset right after the marker."""
    if control_batch_is_commit(bytes(marker)):
        return None
    return AbortedTransaction(
        completed.producer_id,
        completed.first_offset,
        completed.marker_offset,
        completed.marker_offset + 1 if unstable is None else unstable,
    )


class TransactionIndex(IndexFile):
    """The transactions whose ABORT marker landed in this segment.

    The file exists only once a segment has an entry. It is fsynced before the log, so a
    durable marker always has its entry; an entry whose marker was lost is dropped on open.
    Unlike the other indexes it cannot be rebuilt from the log, so it is fsynced whenever dirty.
    """

    def __init__(self, path: Path, truncate: bool) -> None:
        super().__init__(path, truncate, lazy=True)
        self.entries: list[AbortedTransaction] = []
        self.dirty = False

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

    def open(self) -> None:
        """Have the file open (created if new) before an append needs it."""
        self._file()

    def truncate_entries(self, count: int) -> None:
        """Keep only the first `count` entries: an append taken back."""
        if count < len(self.entries):
            del self.entries[count:]
            os.ftruncate(self._file(), count * _ABORTED_ENTRY.size)

    def append(self, entry: AbortedTransaction) -> None:
        """Write the entry, then keep it (a failed write leaves `entries` as they were)."""
        self.dirty = True  # a partly written entry is cut before the next sync counts
        write_fully(self._file(), _encode_aborted(entry), len(self.entries) * _ABORTED_ENTRY.size)
        self.entries.append(entry)

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

    def _rewrite(self) -> None:
        fd = self._file()
        os.ftruncate(fd, 0)
        write_fully(fd, b"".join(_encode_aborted(entry) for entry in self.entries), 0)
        self.dirty = True


def _encode_aborted(entry: AbortedTransaction) -> bytes:
    return _ABORTED_ENTRY.pack(
        0, entry.producer_id, entry.first_offset, entry.last_offset, entry.last_stable_offset
    )
