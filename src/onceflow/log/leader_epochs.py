"""A partition's leader-epoch cache and checkpoint (Kafka's LeaderEpochFileCache, KIP-101).

Each entry says "leader epoch E began at offset S": the first batch stamped with E. The
lookups and the follower's truncation point are pure; only `LeaderEpochCheckpoint` touches a
file, `leader-epoch-checkpoint` in the partition's directory, in Kafka's text format (a
version line, a count line, then one "epoch start_offset" line per entry).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.log.files import write_atomically

_log = logging.getLogger(__name__)

CHECKPOINT_FILE = "leader-epoch-checkpoint"
_CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


@dataclass
class LeaderEpochCache:
    """Entries in increasing epoch and start offset order."""

    entries: list[EpochEntry] = field(default_factory=list)

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` began at `start_offset` if it is newer than the latest; an entry
        at or past that offset is a leftover of a truncated suffix and goes. Whether it changed."""
        if epoch < 0 or epoch <= self.latest_epoch:
            return False
        self.entries = [entry for entry in self.entries if entry.start_offset < start_offset]
        self.entries.append(EpochEntry(epoch, start_offset))
        return True

    def end_offset_for(self, requested: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch, as Kafka's `endOffsetFor`: the largest
        epoch at or below `requested` and the offset where the next epoch began (the log end
        for the latest one). UNDEFINED when `requested` is newer than every epoch known."""
        if requested < 0:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested == self.latest_epoch:
            return requested, log_end_offset
        higher = next((entry for entry in self.entries if entry.epoch > requested), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        floor = [entry for entry in self.entries if entry.epoch <= requested]
        # Older than the first epoch known: its end is where the first known one began.
        return (floor[-1].epoch if floor else requested), higher.start_offset

    def truncate_from_end(self, end_offset: int) -> bool:
        """Forget the epochs that began at or after `end_offset` (the log was cut there)."""
        kept = [entry for entry in self.entries if entry.start_offset < end_offset]
        changed = len(kept) != len(self.entries)
        self.entries = kept
        return changed


@dataclass(frozen=True, slots=True)
class Truncation:
    offset: int
    complete: bool  # False: truncate there, then ask the leader again (KIP-279)


def truncation_point(
    cache: LeaderEpochCache, log_end_offset: int, high_watermark: int, leader_epoch: int, leader_end: int
) -> Truncation:
    """Where a follower cuts its log, given the leader's OffsetForLeaderEpoch answer for the
    follower's latest epoch (Kafka's AbstractFetcherThread.getOffsetTruncationState).

    - Either side knows no such epoch (UNDEFINED): fall back to the high watermark.
    - The leader answers an older epoch that the follower has too: cut at the smaller of both
      ends of that epoch; done.
    - The leader answers an epoch the follower does not have: cut at the end of the follower's
      largest epoch below it, and ask again with what remains.
    """
    follower_epoch, follower_end = cache.end_offset_for(leader_epoch, log_end_offset)
    if UNDEFINED_OFFSET in (leader_end, follower_end):
        return Truncation(min(high_watermark, log_end_offset), True)
    if follower_epoch != leader_epoch:
        return Truncation(min(follower_end, log_end_offset), False)
    return Truncation(min(leader_end, follower_end, log_end_offset), True)


class LeaderEpochCheckpoint:
    """The cache's file, rewritten atomically (fsynced). A new epoch is only marked `pending`
    and written by the log's next flush, off the event loop, before that flush counts any
    batch of it as durable: a broker's death gives every partition it was in sync for a new
    epoch, and two fsyncs each on the event loop held a leader for seconds under disk load
    (Kafka, whose handler threads hold only a partition's lock, moved other fsyncs out of it
    for that reason: KAFKA-15046). After a crash the log's recovery finds the epochs of the
    batches past its last flush in those batches (`PartitionLog.adopt_replayed_epochs`)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / CHECKPOINT_FILE
        self.pending = False
        self._writing = threading.Lock()  # flushes run on several threads

    def read(self) -> LeaderEpochCache:
        try:
            lines = self.path.read_text().split("\n")
        except FileNotFoundError:
            return LeaderEpochCache()
        try:
            version, count = int(lines[0]), int(lines[1])
            if version != _CHECKPOINT_VERSION:
                raise ValueError(f"version {version}")
            entries = [EpochEntry(*map(int, line.split())) for line in lines[2 : 2 + count]]
            if len(entries) != count:
                raise ValueError(f"{len(entries)} entries of {count}")
        except (ValueError, IndexError, TypeError) as error:
            # The next leader change writes it anew; the truncation falls back to the HW meanwhile.
            _log.warning("%s: unreadable (%s); starting with no leader epochs", self.path, error)
            return LeaderEpochCache()
        return LeaderEpochCache(entries)

    def write(self, cache: LeaderEpochCache) -> None:
        with self._writing:
            # Cleared before the entries are read: a change after that marks it again.
            self.pending = False
            entries = cache.entries
            lines = [str(_CHECKPOINT_VERSION), str(len(entries))]
            lines += [f"{entry.epoch} {entry.start_offset}" for entry in entries]
            try:
                write_atomically(self.path, ("\n".join(lines) + "\n").encode())
            except OSError:
                self.pending = True
                raise

    def write_if_pending(self, cache: LeaderEpochCache) -> None:
        if self.pending:
            self.write(cache)
