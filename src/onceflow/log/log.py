"""A partition's live log: an ordered list of segments plus the producer state (opened and
recovered by `loader.py`).

Threading: everything runs on one thread (the event loop) except `flush`, which a worker
thread may run at the same time as `append`. `flush` only reads a few ints and a copy of the
segment list and fsyncs file descriptors; segments are never closed while a flush runs, nor
between `begin_data_flush` and its `DataFlush.finish`.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.log.batch import STORED_PREFIX_SIZE, BatchHeader, control_batch_coordinator_epoch, stored_prefix
from onceflow.log.config import LogConfig
from onceflow.log.errors import (
    LogAppendError,
    LogDirectoryFailure,
    LogLoadError,
    LogReadError,
    UnknownTopicError,
)
from onceflow.log.files import fsync_directory, write_atomically
from onceflow.log.leader_epochs import LeaderEpochCache, LeaderEpochCheckpoint
from onceflow.log.loader import Shutdown, load_log, marker_coordinator_epoch
from onceflow.log.producer_state import (
    ProducerStateManager,
    list_snapshots,
    write_snapshot,
)
from onceflow.log.roll import rolls_by_time
from onceflow.log.scan import CorruptRange
from onceflow.log.segment import MAX_RELATIVE_OFFSET, NOTHING_FETCHED, FetchedBatches, LogSegment, SegmentMark
from onceflow.log.transaction_index import AbortedTransaction, aborted_entry
from onceflow.log_limits import once_per_interval

_log = logging.getLogger(__name__)
_storage_errors = once_per_interval(__name__)

# The log start offset that DeleteRecords set, when it is past the first segment's base (Kafka
# keeps these in one log-start-offset-checkpoint per data directory; one file per partition goes
# away with the partition's directory).
LOG_START_OFFSET_FILE = "log-start-offset"


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int = -1  # only LogAppendTime topics would set it
    duplicate: bool = False


@dataclass(slots=True)
class DataFlush:
    """A flush that is one fdatasync of the active segment, for the caller to run however it
    likes (the broker submits it to the kernel without a thread), then `finish`."""

    fd: int
    finish: Callable[[bool], None]  # with whether the fdatasync succeeded; exactly once


class PartitionLog:
    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[LogSegment],
        producer_state: ProducerStateManager,
        aborted: list[AbortedTransaction],
    ) -> None:
        self.directory = directory
        self.config = config
        self.producer_state = producer_state
        self._segments = segments
        self.log_start_offset = segments[0].base_offset
        self.log_end_offset = segments[-1].next_offset
        self.flushed_offset = self.log_end_offset
        self._lock = threading.Condition()
        self._flushes_running = 0  # on other threads: `close` waits for them
        # Between `begin_data_flush` and its `finish`, which runs on the event loop: `close`,
        # often on that loop, cannot wait for them, so it leaves their files to `finish`.
        self._data_flushes_running = 0
        self._close_after_flush: list[LogSegment] = []
        self.closed = False
        self._last_snapshot_offset = self.log_end_offset
        self._aborted = aborted  # ordered by marker offset
        # New segment files need a directory fsync before their data counts as durable.
        self._segments_created = 0
        self._segments_created_synced = 0
        # Bumped by each truncation: a flush that began before one does not move flushed_offset.
        self._truncations = 0
        self._epoch_checkpoint = LeaderEpochCheckpoint(directory)
        self.leader_epochs = self._epoch_checkpoint.read()
        if self.leader_epochs.truncate_from_end(self.log_end_offset):
            self._epoch_checkpoint.write(self.leader_epochs)  # epochs of a suffix lost in a crash
        self._replayed_epoch_starts: list[tuple[int, int]] = []
        # The log cleaner's bookkeeping (in memory: after a restart everything counts as dirty).
        self.cleaning = False
        self.first_dirty_offset = self.log_start_offset
        self.next_delete_horizon_ms: int | None = None  # when a kept tombstone or marker may go
        # Called when a write leaves files and memory apart: the log directory goes offline.
        self.on_failure: Callable[[str], None] = _log.critical

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        recovery_point: int,
        now_ms: int,
        shutdown: Shutdown = Shutdown.REBOOT,
    ) -> PartitionLog:
        """Open (or create) the log in `directory`, recovering everything written at or
        after `recovery_point` (the last offset known to be fsynced) as the way the broker
        stopped (`shutdown`) allows; see `loader.py`."""
        loaded = load_log(directory, config, recovery_point, now_ms, shutdown)
        log = cls(directory, config, loaded.segments, loaded.producer_state, loaded.aborted)
        log._restore_log_start_offset()
        log._replayed_epoch_starts = loaded.replayed_epoch_starts
        return log

    @property
    def truncations(self) -> int:
        """How many times the log was cut at its end (a follower's truncation) or emptied."""
        return self._truncations

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def producer_snapshot_writer(self) -> Callable[[], None] | None:
        """Capture the producer state now, on the appending thread, and return the call that
        writes it (it fsyncs, so run it off the event loop); None when nothing changed since
        the last snapshot. Periodic snapshots bound the header replay after a crash."""
        offset = self.log_end_offset
        if offset == self._last_snapshot_offset:
            return None
        self._last_snapshot_offset = offset
        data = self.producer_state.encode_snapshot()
        truncations = self._truncations

        def write() -> None:
            # A truncation since the capture took the state's end away: it would describe a
            # log that no longer exists once the log grows past its offset again.
            if truncations == self._truncations:
                try:
                    write_snapshot(self.directory, offset, data)
                except OSError:
                    self._last_snapshot_offset = -1  # the next round takes one again
                    raise

        return write

    # -- writing ------------------------------------------------------------------------------

    def append(
        self,
        records: bytes | bytearray | memoryview,
        headers: list[BatchHeader],
        now_ms: int,
        replicated: bool = False,
        leader_epoch: int | None = None,
        coordinator: bool = False,
    ) -> AppendResult:
        """Append CRC-validated batches (`headers` from `validate_batches(records)`) with
        offsets assigned; `records` itself is neither copied nor changed: each batch's
        offset-bearing prefix is written ahead of the rest. `leader_epoch`: the epoch a leader
        stamps on its clients' batches. Nothing is written on error.
        `replicated`: a follower's copy of its leader's batches, whose leader epochs go in the
        cache (a leader starts its epoch itself; clients' batches carry whatever they like).
        `coordinator`: a coordinator's own batch, bounded by `segment.bytes` alone: a committed
        transaction's offsets are written at once, from TxnOffsetCommits each within the limit."""
        if not headers:
            raise LogAppendError(ErrorCode.invalid_record, "no record batch to append")
        for header in headers:
            if header.size > self.config.max_message_bytes and not coordinator:
                raise LogAppendError(
                    ErrorCode.message_too_large,
                    f"batch of {header.size} bytes exceeds max.message.bytes "
                    f"({self.config.max_message_bytes})",
                )
        if len(records) > self.config.segment_bytes:
            raise LogAppendError(
                ErrorCode.record_list_too_large,
                f"{len(records)} bytes of batches exceed segment.bytes ({self.config.segment_bytes})",
            )
        if len(headers) > 1 and any(header.has_producer_id for header in headers):
            # Kafka requires this from Produce v3 on; it keeps sequence checks per batch simple.
            raise LogAppendError(
                ErrorCode.invalid_record,
                "batches with a producer id must be produced one per partition",
            )
        # A leader's copy is taken as it is, as Kafka's followers take it (no sequence checks for
        # a replication append): the leader checked it, and a follower whose producer state
        # differs (an expiry at another moment) must not refuse it and stop following.
        duplicate = None if replicated else self.producer_state.check_and_prepare(headers[0])
        if duplicate is not None:
            return AppendResult(duplicate.base_offset, duplicate.last_offset, duplicate=True)

        base_offset = self.log_end_offset
        base_offsets = []
        pieces: list[bytes | bytearray | memoryview] = []
        view = memoryview(records)
        offset, position = base_offset, 0
        for header in headers:
            pieces.append(stored_prefix(header, offset, leader_epoch))
            pieces.append(view[position + STORED_PREFIX_SIZE : position + header.size])
            base_offsets.append(offset)
            offset += header.last_offset_delta + 1
            position += header.size
        last_offset = offset - 1
        # Everything an append changes is decided before anything is written, then written
        # (the segment, the aborted transactions' index entries, new leader epochs), undone if
        # any write fails, and only then applied: a reader never sees a marker without its index
        # entry, nor state the files do not hold. What cannot be undone takes the log offline.
        aborted = self._aborted_by(headers, base_offsets, view) if any(h.is_control for h in headers) else []
        epochs = self.leader_epochs.entries
        try:
            active = self._segment_for(len(records), last_offset, headers, now_ms)
            if aborted:
                active.txn_index.open()  # an append must not fail half-way for a descriptor
            if replicated:
                self._assign_epochs_of(headers, base_offsets)
            before = active.mark()
            active.append(pieces, headers, base_offsets, self.config.index_interval_bytes)
        except OSError as exc:
            self.leader_epochs.entries = epochs
            message = f"{self.directory.name}: append failed: {exc}"
            _storage_errors.error("%s; nothing was written", message)
            raise LogAppendError(ErrorCode.kafka_storage_error, message) from exc
        entries_before = len(active.txn_index.entries)
        try:
            for entry in aborted:
                active.txn_index.append(entry)
        except OSError as exc:
            self.leader_epochs.entries = epochs
            self._undo_append(active, before, entries_before, exc)
            message = f"{active.txn_index.path}: write failed: {exc}"
            _storage_errors.error("%s; the batches written before it were taken back", message)
            raise LogAppendError(ErrorCode.kafka_storage_error, message) from exc
        self.log_end_offset = offset
        position = 0
        for header, batch_offset in zip(headers, base_offsets, strict=True):
            batch = view[position : position + header.size]
            coordinator_epoch = control_batch_coordinator_epoch(batch) if header.is_control else -1
            self.producer_state.update(header, batch_offset, now_ms, coordinator_epoch)
            position += header.size
        self._aborted += aborted
        return AppendResult(base_offset, last_offset)

    def adopt_replayed_epochs(self) -> None:
        """Take the leader epochs that the batches replayed at open are stamped with, which a
        crash before the checkpoint's next write left out of it (as Kafka's recovery does).
        Only for a log whose leaders stamp their epochs: clients stamp anything."""
        for epoch, start in self._replayed_epoch_starts:
            if self.leader_epochs.assign(epoch, start):
                self._epoch_checkpoint.pending = True
        self._replayed_epoch_starts = []

    def epoch_start_offset(self, epoch: int) -> int:
        """Where `epoch` began in this log (the log end if it has no entry)."""
        starts = [entry.start_offset for entry in self.leader_epochs.entries if entry.epoch == epoch]
        return starts[0] if starts else self.log_end_offset

    def assign_leader_epoch(self, epoch: int, start_offset: int | None = None) -> None:
        """`epoch` begins at `start_offset` (a new leader: at its log end), checkpointed by the
        next flush."""
        start = self.log_end_offset if start_offset is None else start_offset
        if self.leader_epochs.assign(epoch, start):
            self._epoch_checkpoint.pending = True

    def truncate_to(self, offset: int, now_ms: int) -> None:
        """Drop every batch at or after `offset` (a batch boundary at or above the log start
        offset): a follower's divergent suffix. The producer state is rebuilt from the newest
        snapshot at or below `offset`, as when the log is opened. A cut that fails half-way
        leaves files and memory apart: the log goes offline (LogDirectoryFailure)."""
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            raise ValueError(f"cannot truncate to {offset}, below the log start {self.log_start_offset}")
        try:
            self._truncate_to(offset, now_ms)
        except OSError as error:
            raise self._offline(f"cutting it at {offset} failed half-way: {error}") from error

    def _truncate_to(self, offset: int, now_ms: int) -> None:
        keep = max(bisect_right(self._segments, offset - 1, key=_base_offset), 1)
        doomed, self._segments = self._segments[keep:], self._segments[:keep]
        for segment in doomed:
            segment.delete_files()
            self._close_when_unused(segment)
        if doomed:
            fsync_directory(self.directory)
        self._segments[-1].truncate_to(offset, self.config.index_interval_bytes)
        with self._lock:
            self._truncations += 1
            self.log_end_offset = self._segments[-1].next_offset
            self.flushed_offset = min(self.flushed_offset, self.log_end_offset)
        if self.leader_epochs.truncate_from_end(self.log_end_offset):
            self._epoch_checkpoint.write(self.leader_epochs)
        self._aborted = [entry for entry in self._aborted if entry.last_offset < self.log_end_offset]
        self.first_dirty_offset = min(self.first_dirty_offset, self.log_end_offset)
        self.producer_state = ProducerStateManager()
        snapshot_offset = self.producer_state.load_latest_snapshot(self.directory, offset)
        replay_from = max(snapshot_offset, self.log_start_offset)
        self._last_snapshot_offset = replay_from
        first = max(bisect_right(self._segments, replay_from, key=_base_offset) - 1, 0)
        for segment in self._segments[first:]:
            for header in segment.batches_from(replay_from):
                coordinator_epoch = marker_coordinator_epoch(segment, header)
                self.producer_state.update(header, header.base_offset, now_ms, coordinator_epoch)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and start it empty at `offset` (above its end): a follower whose
        leader's log now starts past it (DeleteRecords or retention there), as Kafka's
        `truncateFullyAndStartAt`. The new start is durable before anything is deleted; a
        failure after that takes the log offline (LogDirectoryFailure)."""
        if offset <= self.log_end_offset:
            raise ValueError(f"cannot start at {offset}, not past the log end {self.log_end_offset}")
        write_atomically(self.directory / LOG_START_OFFSET_FILE, f"{offset}\n".encode())
        try:
            self._start_empty_at(offset)
        except OSError as error:
            raise self._offline(f"starting it anew at {offset} failed half-way: {error}") from error

    def _start_empty_at(self, offset: int) -> None:
        doomed, self._segments = self._segments, [LogSegment.create(self.directory, offset)]
        for segment in doomed:
            segment.delete_files()
            self._close_when_unused(segment)
        fsync_directory(self.directory)
        with self._lock:
            self._truncations += 1
            self.log_start_offset = self.log_end_offset = self.flushed_offset = offset
        self.leader_epochs = LeaderEpochCache()
        self._epoch_checkpoint.write(self.leader_epochs)
        self._aborted = []
        self.first_dirty_offset = offset
        self.producer_state = ProducerStateManager()
        for snapshot in list_snapshots(self.directory):
            snapshot.unlink()
        self._last_snapshot_offset = offset

    def _aborted_by(
        self, headers: list[BatchHeader], base_offsets: list[int], records: memoryview
    ) -> list[AbortedTransaction]:
        """The index entries of the transactions that the ABORT markers among `headers` end."""
        entries = []
        positions = dict.fromkeys(base_offsets, 0)
        position = 0
        for header, base_offset in zip(headers, base_offsets, strict=True):
            positions[base_offset] = position
            position += header.size
        for index, completed, unstable in self.producer_state.endings(headers, base_offsets):
            at = positions[base_offsets[index]]
            entry = aborted_entry(completed, records[at : at + headers[index].size], unstable)
            if entry is not None:
                entries.append(entry)
        return entries

    def _segment_for(
        self, size: int, last_offset: int, headers: list[BatchHeader], now_ms: int
    ) -> LogSegment:
        """The segment an append of `size` bytes ending at `last_offset` goes to: the active one,
        or a new one when it would outgrow segment.bytes or int32 relative offsets, or is older
        than segment.ms (`roll.py`)."""
        active = self._segments[-1]
        if active.size and (
            active.size + size > self.config.segment_bytes
            or last_offset - active.base_offset > MAX_RELATIVE_OFFSET
            or rolls_by_time(active, self.config, headers, now_ms)
        ):
            return self._roll()
        return active

    def _assign_epochs_of(self, headers: list[BatchHeader], base_offsets: list[int]) -> None:
        """A follower's copy: the leader epochs its batches begin."""
        for header, batch_offset in zip(headers, base_offsets, strict=True):
            if header.partition_leader_epoch > self.leader_epochs.latest_epoch:
                self.assign_leader_epoch(header.partition_leader_epoch, batch_offset)

    def _offline(self, what: str) -> LogDirectoryFailure:
        """The failure that takes this log's directory offline, reported to `on_failure`."""
        failure = LogDirectoryFailure(f"{self.directory.name}: {what}")
        self.on_failure(failure.message)
        return failure

    def _undo_append(self, segment: LogSegment, before: SegmentMark, entries: int, cause: OSError) -> None:
        """Take back a segment write whose index entries could not be written; a log that cannot
        be put back as it was is offline (LogDirectoryFailure)."""
        try:
            segment.undo_append(before)
            segment.txn_index.truncate_entries(entries)
        except OSError as exc:
            raise self._offline(f"an append failed ({cause}) and could not be taken back ({exc})") from exc

    # -- transactions -------------------------------------------------------------------------

    def last_stable_offset(self, high_watermark: int) -> int:
        """Below this offset every transaction is decided (read_committed reads stop here)."""
        unstable = self.producer_state.first_unstable_offset()
        return high_watermark if unstable is None else min(unstable, high_watermark)

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTransaction]:
        """Aborted transactions with data in [fetch_offset, upper_bound), for read_committed fetches."""
        found = []
        start = bisect_left(self._aborted, fetch_offset, key=_marker_offset)
        for entry in self._aborted[start:]:
            if entry.first_offset < upper_bound:
                found.append(entry)
            if entry.last_stable_offset >= upper_bound:
                break  # every later abort began at or after this LSO (Kafka's stopping rule)
        return found

    def _roll(self) -> LogSegment:
        segment = LogSegment.create(self.directory, self.log_end_offset)
        # The state as of the new segment's base bounds the replay after a crash; without it a
        # restart replays from an older snapshot, so a full disk must not stop the roll.
        try:
            self.producer_state.take_snapshot(self.directory, self.log_end_offset)
        except OSError as error:
            _log.warning("%s: no producer snapshot: %s", segment.log_path, error)
        # Replace, not mutate: a concurrent flush iterates its own copy.
        self._segments = [*self._segments, segment]
        self._segments_created += 1
        return segment

    # -- reading ------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the one containing `offset`: up to `max_bytes`, but at least
        one batch when there is one (KIP-74), and none starting at or after `max_offset`."""
        return self.read_batches(offset, max_bytes, max_offset).records

    def read_batches(self, offset: int, max_bytes: int, max_offset: int | None = None) -> FetchedBatches:
        """As `read`, with the offset after the batches read (a fetch's upper bound for the
        aborted transactions it lists)."""
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise LogReadError(
                ErrorCode.offset_out_of_range,
                f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]",
            )
        limit = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        if offset >= limit:  # the common case of a consumer waiting at the end
            return NOTHING_FETCHED
        # An offset below the first segment (in a gap that cleaning left, which retention or
        # DeleteRecords put the log start in) reads from the first batch after it, as in Kafka;
        # -1 would read the active segment alone and skip the rest.
        first = max(bisect_right(self._segments, offset, key=_base_offset) - 1, 0)
        for segment in self._segments[first:]:
            if segment.base_offset >= limit:
                break
            fetched = segment.read(offset, max_bytes, limit)
            if fetched.records:
                return fetched
        return NOTHING_FETCHED

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start whose timestamp is
        at least `timestamp_ms`, or None when there is none."""
        for segment in self._segments:
            if segment.max_timestamp >= timestamp_ms and segment.next_offset > self.log_start_offset:
                found = segment.find_timestamp(timestamp_ms, self.log_start_offset)
                if found is not None:
                    return found
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(base offset, timestamp) of the first batch holding the largest timestamp
        (ListOffsets' MAX_TIMESTAMP), or None when the log is empty."""
        non_empty = [segment for segment in self._segments if segment.size]
        if not non_empty:
            return None
        newest = max(non_empty, key=lambda segment: segment.max_timestamp)
        return newest.find_timestamp(newest.max_timestamp)

    @property
    def corrupt_ranges(self) -> list[CorruptRange]:
        """What recovery found unreadable and kept, in offset order."""
        return [found for segment in self._segments for found in segment.corrupt]

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    # -- the log start offset -----------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start offset forward to `offset` (at most the end of the
        log), durably before anything is deleted, then delete the segments wholly below it.
        Returns the log start offset. Runs on the appending thread."""
        offset = min(offset, self.log_end_offset)
        if offset > self.log_start_offset:
            write_atomically(self.directory / LOG_START_OFFSET_FILE, f"{offset}\n".encode())
            self._advance_log_start(offset)
        return self.log_start_offset

    def _restore_log_start_offset(self) -> None:
        path = self.directory / LOG_START_OFFSET_FILE
        try:
            recorded = int(path.read_text())
        except FileNotFoundError:
            return
        except ValueError as exc:
            # Guessing would either serve deleted records again or hide kept ones.
            raise LogLoadError(
                f"{path} is unreadable ({exc}); delete it to serve the partition from its first segment"
            ) from None
        if recorded > self.log_start_offset:
            self._advance_log_start(min(recorded, self.log_end_offset))

    def _advance_log_start(self, offset: int) -> None:
        self._forget_below(offset)
        if not self.cleaning:  # the cleaner is reading them: retention deletes them later
            self._delete_segments_below_log_start()

    def _forget_below(self, offset: int) -> None:
        self.log_start_offset = max(self.log_start_offset, offset)
        self._aborted = [entry for entry in self._aborted if entry.last_offset >= self.log_start_offset]
        self.first_dirty_offset = max(self.first_dirty_offset, self.log_start_offset)

    def _delete_segments_below_log_start(self) -> int:
        below = sum(1 for segment in self._segments[:-1] if segment.next_offset <= self.log_start_offset)
        self._delete_oldest_segments(below)
        return below

    def _delete_oldest_segments(self, count: int) -> None:
        deleted, self._segments = self._segments[:count], self._segments[count:]
        for segment in deleted:
            segment.delete_files()
            self._close_when_unused(segment)

    # -- durability ---------------------------------------------------------------------------

    def begin_data_flush(self) -> DataFlush | None:
        """The common flush, everything appended so far being in the active segment's data:
        the fdatasync to run, and what records it once run. None when the flush needs more (a
        new segment's directory entry, a new leader epoch, a rolled segment's indexes, the
        transaction index, or nothing to sync at all): `flush` on a thread then."""
        with self._lock:
            active = self._segments[-1]
            if (
                self.closed
                or self._segments_created > self._segments_created_synced
                or self._epoch_checkpoint.pending
                or active.txn_index.dirty
                or active.synced_size >= active.size
                or any(segment.needs_sync(with_indexes=True) for segment in self._segments[:-1])
            ):
                return None
            self._data_flushes_running += 1
        end, size, truncations = self.log_end_offset, active.size, self._truncations
        segment_truncations = active.truncations

        def finish(synced: bool) -> None:
            try:
                if synced:
                    active.record_synced(size, segment_truncations)
                    with self._lock:
                        if truncations == self._truncations:
                            self.flushed_offset = max(self.flushed_offset, end)
            finally:
                with self._lock:
                    self._data_flushes_running -= 1
                    self._close_unused_segments()

        return DataFlush(active.fd, finish)

    def flush(self) -> int:
        """fsync everything appended so far; returns the offset below which all is durable.
        Safe to call from another thread while `append` runs."""
        with self._lock:
            if self.closed:
                return self.flushed_offset
            self._flushes_running += 1
        try:
            # Capture the end before the segments: every batch below it is then in one of them.
            end = self.log_end_offset
            truncations = self._truncations
            segments_created = self._segments_created
            segments = self._segments
            for segment in segments:
                is_active = segment is segments[-1]
                if segment.needs_sync(with_indexes=not is_active):
                    segment.sync(with_indexes=not is_active)
            if segments_created > self._segments_created_synced:
                fsync_directory(self.directory)
            # The epochs of the batches below `end` were assigned before `end` was read.
            self._epoch_checkpoint.write_if_pending(self.leader_epochs)
            with self._lock:
                self._segments_created_synced = max(self._segments_created_synced, segments_created)
                if truncations == self._truncations:
                    self.flushed_offset = max(self.flushed_offset, end)
                return self.flushed_offset
        finally:
            self._unpin_segments()

    def apply_retention(self, now_ms: int) -> int:
        """Delete the oldest segments that are past retention.ms (by their largest timestamp)
        or beyond retention.bytes, never the active one. Returns how many were deleted."""
        if not self.config.delete or self.cleaning:
            return 0  # compact only; or the cleaner is reading these segments: next time
        retention_ms = self.config.retention_ms
        retention_bytes = self.config.retention_bytes
        excess_bytes = self.size_bytes - retention_bytes
        doomed = 0
        for segment in self._segments[:-1]:
            expired = retention_ms >= 0 and now_ms - segment.largest_timestamp > retention_ms
            too_big = retention_bytes >= 0 and excess_bytes >= segment.size
            if not (expired or too_big):
                break
            excess_bytes -= segment.size
            doomed += 1
        if not doomed:
            return self._delete_segments_below_log_start()
        self._delete_oldest_segments(doomed)
        self._forget_below(self._segments[0].base_offset)
        return doomed

    def _close_when_unused(self, *segments: LogSegment) -> None:
        with self._lock:
            self._close_after_flush += segments
            self._close_unused_segments()

    def _close_unused_segments(self) -> None:
        """Close the segments left to close, unless a flush may still use their files. Under the lock."""
        if not (self._flushes_running or self._data_flushes_running):
            for segment in self._close_after_flush:
                segment.close()
            self._close_after_flush.clear()

    # -- log cleaning (the algorithm is in cleaner.py) ----------------------------------------

    def cleanable_segments(self, now_ms: int, below: int | None = None) -> list[LogSegment]:
        """The oldest closed segments the cleaner may rewrite: wholly flushed, below every open
        transaction and `below` (a replica's high watermark: a leader change may cut what is
        above it, and a key's older value must then still be there), and older than
        min.compaction.lag.ms. Never the active segment."""
        unstable = self.producer_state.first_unstable_offset()
        limit = min(self.flushed_offset, self.log_end_offset if unstable is None else unstable)
        if below is not None:
            limit = min(limit, below)
        closed = self._segments[:-1]
        cleanable = []
        for segment, following in zip(closed, self._segments[1:], strict=True):
            if following.base_offset > limit:
                break
            if now_ms - segment.largest_timestamp < self.config.min_compaction_lag_ms:
                break
            cleanable.append(segment)
        return cleanable

    def segment_end(self, segment: LogSegment) -> int:
        """The offset after everything `segment` covers: the next segment's base offset."""
        index = self._segments.index(segment)
        return self._segments[index + 1].base_offset

    @property
    def aborted_transaction_list(self) -> list[AbortedTransaction]:
        return list(self._aborted)

    @contextmanager
    def segments_pinned(self) -> Iterator[None]:
        """Keep the segment files open while this thread reads them (the cleaner's, a search by
        timestamp), as a running flush does: retention and close wait for the end of the block.
        Enter it on the reading thread, never across an await: `close` runs on the event loop
        and would wait forever for a coroutine that needs the loop to let go. A log already
        closed (its topic deleted, or the broker stopping) raises UnknownTopicError."""
        with self._lock:
            if self.closed:
                raise UnknownTopicError(f"{self.directory.name} is closed: deleted, or the broker stops")
            self._flushes_running += 1
        try:
            yield
        finally:
            self._unpin_segments()

    def _unpin_segments(self) -> None:
        with self._lock:
            self._flushes_running -= 1
            self._close_unused_segments()
            if not self._flushes_running:
                self._lock.notify_all()

    def replace_segment(self, old: LogSegment, new: LogSegment | None) -> None:
        """Put a cleaned segment (already in place on disk) where `old` was, or with None,
        delete `old`, which cleaning emptied (not the first: it holds the log start offset)."""
        index = self._segments.index(old)
        replacement = [] if new is None else [new]
        self._segments = [*self._segments[:index], *replacement, *self._segments[index + 1 :]]
        self._aborted = [entry for segment in self._segments for entry in segment.txn_index.entries]
        if new is None:
            old.delete_files()
            fsync_directory(self.directory)
        self._close_when_unused(old)

    def close(self, flush: bool = True) -> None:
        """Close the files. With `flush` (a clean shutdown), first fsync everything and
        snapshot the producer state at the end so the next open replays nothing; without it
        (the log is about to be deleted), just let go."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._lock.wait_for(lambda: not self._flushes_running)
        if flush:
            for segment in self._segments:
                if segment.needs_sync(with_indexes=True):
                    segment.sync(with_indexes=True)
            fsync_directory(self.directory)
            self._epoch_checkpoint.write_if_pending(self.leader_epochs)
            self.flushed_offset = self.log_end_offset
            self.producer_state.take_snapshot(self.directory, self.log_end_offset)
        self._close_when_unused(*self._segments)


def _base_offset(segment: LogSegment) -> int:
    return segment.base_offset


def _marker_offset(entry: AbortedTransaction) -> int:
    return entry.last_offset
