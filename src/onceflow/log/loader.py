"""Opening a partition's log after a restart or a crash (Kafka's `LogLoader`): finish or discard
an interrupted clean, verify the segments past the recovery point and cut the log at the first
torn or corrupt batch, then rebuild the producer state and the aborted transactions from the
newest snapshot plus a replay of the batches after it. The live log (`log.py`) starts from what
this returns."""

from __future__ import annotations

import enum
import logging
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from onceflow.log.batch import BatchHeader, control_batch_coordinator_epoch
from onceflow.log.config import LogConfig
from onceflow.log.errors import LogLoadError
from onceflow.log.files import fsync_directory
from onceflow.log.producer_state import ProducerStateManager
from onceflow.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    finish_interrupted_cleaning,
)
from onceflow.log.transaction_index import AbortedTransaction, aborted_entry

__all__ = ["LoadedLog", "Shutdown", "load_log", "marker_coordinator_epoch"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedLog:
    segments: list[LogSegment]  # at least one, consecutive, all recovered
    producer_state: ProducerStateManager
    aborted: list[AbortedTransaction]  # ordered by marker offset
    # (epoch, base offset) of each replayed batch stamped with an epoch above all before it
    replayed_epoch_starts: list[tuple[int, int]]


class Shutdown(enum.Enum):
    """How the broker that last had the log stopped, which decides what recovery may cut."""

    CLEAN = "clean"  # it flushed and closed everything: nothing to check (Kafka's clean shutdown)
    CRASH = "crash"  # the process died, the machine did not: every write it made reached the page cache
    REBOOT = "reboot"  # the machine restarted (or nobody knows): unflushed writes may be torn


def load_log(
    directory: Path, config: LogConfig, recovery_point: int, now_ms: int, shutdown: Shutdown = Shutdown.REBOOT
) -> LoadedLog:
    """Open (or create) the segments in `directory`, recovering everything written at or
    after `recovery_point` (the last offset known to be fsynced) as `shutdown` allows."""
    directory.mkdir(parents=True, exist_ok=True)
    if finish_interrupted_cleaning(directory):
        fsync_directory(directory)
    base_offsets = _discover_segments(directory)
    if base_offsets:
        segments = [LogSegment.open(directory, base) for base in base_offsets]
        segments = _recover(segments, recovery_point, config.index_interval_bytes, shutdown)
    else:
        segments = [LogSegment.create(directory, 0)]
        fsync_directory(directory)
    producer_state = ProducerStateManager()
    # A snapshot past the recovery point may have been written before the transaction index
    # entries below it were fsynced: replaying from there would not find those aborts again.
    newest_usable = min(segments[-1].next_offset, recovery_point)
    snapshot_offset = producer_state.load_latest_snapshot(directory, newest_usable)
    replay_from = max(snapshot_offset, segments[0].base_offset)
    for segment in segments:
        # Aborts at or after the replay start are found again by the replay.
        segment.txn_index.truncate_to(replay_from)
    aborted = [entry for segment in segments for entry in segment.txn_index.entries]
    epoch_starts: list[tuple[int, int]] = []
    for segment, header in _batches_from(segments, replay_from):
        if header.partition_leader_epoch > (epoch_starts[-1][0] if epoch_starts else -1):
            epoch_starts.append((header.partition_leader_epoch, header.base_offset))
        # Replayed producers count as active now: their real idle time is unknown.
        marker = _marker(segment, header)
        coordinator_epoch = -1 if marker is None else control_batch_coordinator_epoch(marker)
        completed = producer_state.update(header, header.base_offset, now_ms, coordinator_epoch)
        if completed is None or marker is None:
            continue
        entry = aborted_entry(completed, marker, producer_state.first_unstable_offset())
        if entry is not None:
            segment.txn_index.append(entry)
            aborted.append(entry)
    producer_state.remove_expired(now_ms, config.producer_id_expiration_ms)
    return LoadedLog(segments, producer_state, aborted, epoch_starts)


def marker_coordinator_epoch(segment: LogSegment, header: BatchHeader) -> int:
    """The coordinator epoch of a replayed marker, read from its segment; -1 for other batches."""
    marker = _marker(segment, header)
    return -1 if marker is None else control_batch_coordinator_epoch(marker)


def _marker(segment: LogSegment, header: BatchHeader) -> bytes | None:
    """A control batch's bytes, read from its segment; None for other batches."""
    if not header.is_control:
        return None
    return bytes(segment.read(header.base_offset, 1, header.base_offset + 1).records)


def _batches_from(segments: list[LogSegment], offset: int) -> Iterator[tuple[LogSegment, BatchHeader]]:
    """The headers of the batches whose last offset is at or after `offset`, with their segment."""
    first = max(bisect_right(segments, offset, key=_base_offset) - 1, 0)
    for segment in segments[first:]:
        for header in segment.batches_from(offset):
            yield segment, header


def _base_offset(segment: LogSegment) -> int:
    return segment.base_offset


def _discover_segments(directory: Path) -> list[int]:
    """Base offsets of the segment files; index files left without their log are removed."""
    paths = list(directory.iterdir())
    base_offsets = {int(path.stem) for path in paths if path.suffix == LOG_SUFFIX and path.stem.isdigit()}
    for path in paths:
        is_index = path.suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX) and path.stem.isdigit()
        if is_index and int(path.stem) not in base_offsets:
            path.unlink()
    return sorted(base_offsets)


def _recover(
    segments: list[LogSegment], recovery_point: int, index_interval_bytes: int, shutdown: Shutdown
) -> list[LogSegment]:
    """Trust the segments wholly below the one containing `recovery_point` (all of them after a
    clean shutdown); verify the rest batch by batch, and cut the log where a crash may have torn
    it (Kafka's recovery). What was fsynced is never cut: a corrupt stretch there is kept and
    reported, and so is one between intact batches after a crash the machine survived."""
    base_offsets = [segment.base_offset for segment in segments]
    containing = max(bisect_right(base_offsets, recovery_point) - 1, 0)
    for i, segment in enumerate(segments):
        trusted = shutdown is Shutdown.CLEAN or i < containing
        # Cleaned segments leave gaps, so a segment may start past the end of the last one.
        if i and segment.base_offset < segments[i - 1].next_offset:
            if trusted:
                raise LogLoadError(
                    f"{segment.log_path} overlaps the segment before it, which ends at offset "
                    f"{segments[i - 1].next_offset}; move one of them away to start"
                )
            _log.error(
                "%s: overlaps the segment before, which ends at %d; dropping it and the segments after it",
                segment.log_path,
                segments[i - 1].next_offset,
            )
            return _drop_segments(segments, i)
        verify_from = None if trusted else recovery_point if i == containing else segment.base_offset
        last = i == len(segments) - 1
        truncated = segment.recover(
            verify_from, index_interval_bytes, shutdown is Shutdown.CRASH, keep_tail=not last
        )
        segment.end_corrupt_tail(recovery_point if last else segments[i + 1].base_offset)
        if trusted:
            segment.synced_size = segment.size
        else:
            # What survived may only be in the page cache (after a process kill): make it
            # durable so that the whole recovered log counts as flushed.
            segment.sync(with_indexes=False)
        if truncated:
            return _drop_segments(segments, i + 1)
    return segments


def _drop_segments(segments: list[LogSegment], keep: int) -> list[LogSegment]:
    for segment in segments[keep:]:
        segment.close()
        segment.delete_files()
    if segments[keep:]:
        fsync_directory(segments[0].log_path.parent)
    return segments[:keep]
