"""Log compaction (after Kafka's LogCleaner): keep the last record of every key.

A clean runs in three steps, so that the slow one can leave the event loop:

1. `plan_cleaning` (the appending thread) picks the cleanable segments: closed, wholly
   flushed, below every open transaction, older than `min.compaction.lag.ms`; and only when
   their dirty share reaches `min.cleanable.dirty.ratio` (or a kept tombstone may now go).
2. `write_cleaned_segments` (any thread) maps every key to its last offset in those segments,
   then writes each segment again under `.cleaned` names, without the records a later one of
   the same key replaced, without aborted transactions' records, and without tombstones and
   transaction markers older than `delete.retention.ms`; then fsyncs.
3. `swap_in` (the appending thread) renames `.cleaned` to `.swap` (the `.log` last: that
   rename commits the swap), then over the old segment, and puts the new one in its place.
   After a crash, `segment.finish_interrupted_cleaning` completes or discards a swap.

Offsets never change: a cleaned segment has gaps, and a fetch inside one gets the next batch.
A batch keeps its base and last offset and its producer fields even when records leave it,
and the last batch of every producer stays, even empty (Kafka's RETAIN_EMPTY), so producer
state rebuilt from the log keeps the right sequences. A marker stays while its transaction
has records left. A tombstone goes once its timestamp is `delete.retention.ms` old, a marker
once its batch's is (Kafka 3.1+ stamps a horizon into the batch when it first cleans it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from onceflow import failpoints
from onceflow.log.batch import BatchHeader, decode_records_with_bytes, parse_batch_header, rebuild_batch
from onceflow.log.files import fsync_directory
from onceflow.log.log import PartitionLog
from onceflow.log.segment import CLEANED_SUFFIX, SWAP_SUFFIX, LogSegment, rename_files


@dataclass(frozen=True)
class CleaningPlan:
    log: PartitionLog
    segments: list[LogSegment]
    end_offset: int  # everything below is cleaned once this plan is swapped in
    now_ms: int
    # Producer id -> (first offset, marker offset) of each of its aborted transactions.
    aborted: dict[int, list[tuple[int, int]]]
    # Producer id -> last offset of its last batch: that batch is never removed.
    producer_last_offsets: dict[int, int]
    truncations: int  # the log's, when planned: a truncation since voids the plan


@dataclass
class CleaningResult:
    segments: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_removed: int = 0
    # Earliest time at which a tombstone or marker kept now could be removed.
    next_delete_horizon_ms: int | None = None
    written: list[tuple[LogSegment, LogSegment]] = field(default_factory=list)  # (old, cleaned)


def plan_cleaning(
    log: PartitionLog, now_ms: int, force: bool = False, below: int | None = None
) -> CleaningPlan | None:
    """What to clean now, or None. `force` ignores the dirty ratio (tests, the benchmark);
    `below`: the partition's high watermark (see `PartitionLog.cleanable_segments`)."""
    if not log.config.compact or log.closed or log.cleaning:
        return None
    segments = log.cleanable_segments(now_ms, below)
    if not segments:
        return None
    end_offset = log.segment_end(segments[-1])
    total = sum(segment.size for segment in segments)
    dirty = sum(segment.size for segment in segments if log.segment_end(segment) > log.first_dirty_offset)
    horizon = log.next_delete_horizon_ms
    due = (total and dirty and dirty / total >= log.config.min_cleanable_dirty_ratio) or (
        horizon is not None and now_ms >= horizon
    )
    if not (force or due):
        return None
    aborted: dict[int, list[tuple[int, int]]] = {}
    for entry in log.aborted_transaction_list:
        aborted.setdefault(entry.producer_id, []).append((entry.first_offset, entry.last_offset))
    producer_last_offsets = {
        entry.producer_id: entry.batches[-1].last_offset
        for entry in log.producer_state.entries()
        if entry.batches
    }
    log.cleaning = True
    return CleaningPlan(log, segments, end_offset, now_ms, aborted, producer_last_offsets, log.truncations)


def write_cleaned_segments(plan: CleaningPlan) -> CleaningResult:
    """Step 2; safe off the appending thread. On failure nothing but `.cleaned` files exist,
    and those are removed."""
    result = CleaningResult()
    with plan.log.segments_pinned():
        try:
            latest = _last_offsets_by_key(plan)
            _write_segments(plan, latest, result)
        except BaseException:
            for _, cleaned in result.written:
                cleaned.close()
                cleaned.delete_files()
            raise
    return result


def swap_in(plan: CleaningPlan, result: CleaningResult) -> CleaningResult:
    """Step 3, on the appending thread. A segment that retention or a topic deletion took
    away meanwhile is left alone (its cleaned copy is deleted); after a truncation (a
    follower's) every one is: a copy would bring back what it cut."""
    log = plan.log
    for _, cleaned in result.written:
        cleaned.close()  # written and fsynced; the swapped-in segment opens the files anew
    try:
        for old, cleaned in result.written:
            if log.closed or old not in log.segments or log.truncations != plan.truncations:
                with contextlib.suppress(OSError):
                    cleaned.delete_files()
                continue
            if not cleaned.size and old is not log.segments[0]:
                cleaned.delete_files()  # an empty segment in the middle is only a gap
                log.replace_segment(old, None)
                continue
            base_offset = old.base_offset
            rename_files(log.directory, base_offset, CLEANED_SUFFIX, SWAP_SUFFIX)
            fsync_directory(log.directory)
            failpoints.reach("cleaner.mid-swap")
            rename_files(log.directory, base_offset, SWAP_SUFFIX, "")
            fsync_directory(log.directory)
            swapped = LogSegment.open(log.directory, base_offset)
            swapped.recover(None, log.config.index_interval_bytes, keep_corrupt=True)
            swapped.synced_size = swapped.size
            swapped.indexes_synced = True
            log.replace_segment(old, swapped)
        log.first_dirty_offset = max(log.first_dirty_offset, plan.end_offset)
        log.next_delete_horizon_ms = result.next_delete_horizon_ms
    finally:
        log.cleaning = False
    return result


def abandon(plan: CleaningPlan) -> None:
    """After a failed step 2: let the next round try again."""
    plan.log.cleaning = False


def clean_log(
    log: PartitionLog, now_ms: int, force: bool = False, below: int | None = None
) -> CleaningResult | None:
    """All three steps on the calling thread: for tests and the storage layer's own users."""
    plan = plan_cleaning(log, now_ms, force, below)
    if plan is None:
        return None
    try:
        result = write_cleaned_segments(plan)
    except BaseException:
        abandon(plan)
        raise
    return swap_in(plan, result)


def _is_aborted(plan: CleaningPlan, header: BatchHeader) -> bool:
    if not header.is_transactional or header.is_control:
        return False
    ranges = plan.aborted.get(header.producer_id, ())
    return any(first <= header.base_offset < marker for first, marker in ranges)


def _last_offsets_by_key(plan: CleaningPlan) -> dict[bytes, int]:
    """Kafka's offset map, for the cleanable segments. Aborted records do not count: they
    must not hide an older committed value."""
    latest: dict[bytes, int] = {}
    for segment in plan.segments:
        for header, batch in segment.batches():
            if header.is_control or _is_aborted(plan, header):
                continue
            for record, _ in decode_records_with_bytes(batch):
                if record.key is not None:
                    latest[record.key] = record.offset
    return latest


def _write_segments(plan: CleaningPlan, latest: dict[bytes, int], result: CleaningResult) -> None:
    log = plan.log
    delete_retention_ms = log.config.delete_retention_ms
    horizon_ms = plan.now_ms - delete_retention_ms
    txn_has_records: dict[int, bool] = {}  # producer id -> its current transaction kept a batch
    horizons: list[int] = []
    for segment in plan.segments:
        cleaned = LogSegment.create_cleaned(log.directory, segment.base_offset)
        result.written.append((segment, cleaned))
        kept_markers: set[int] = set()
        for header, batch in segment.batches():
            result.bytes_before += header.size
            if header.is_control:
                has_records = txn_has_records.pop(header.producer_id, False)
                if not has_records and header.max_timestamp < horizon_ms:
                    continue
                if not has_records:
                    horizons.append(header.max_timestamp + delete_retention_ms)
                kept_markers.add(header.base_offset)
                kept: bytes | bytearray = batch
            else:
                kept_records = []
                if not _is_aborted(plan, header):
                    for record, encoded in decode_records_with_bytes(batch):
                        if record.key is not None and latest.get(record.key) != record.offset:
                            continue
                        if record.value is None:
                            if record.timestamp < horizon_ms:
                                continue
                            horizons.append(record.timestamp + delete_retention_ms)
                        kept_records.append(encoded)
                result.records_removed += header.record_count - len(kept_records)
                producers_last = (
                    header.has_producer_id
                    and plan.producer_last_offsets.get(header.producer_id) == header.last_offset
                )
                if not kept_records and not producers_last:
                    continue
                if header.is_transactional:
                    txn_has_records[header.producer_id] = True  # an empty batch keeps its marker too
                kept = (
                    batch if len(kept_records) == header.record_count else rebuild_batch(header, kept_records)
                )
            kept_header = parse_batch_header(kept)
            cleaned.append([kept], [kept_header], [kept_header.base_offset], log.config.index_interval_bytes)
            result.bytes_after += kept_header.size
        for entry in segment.txn_index.entries:
            if entry.last_offset in kept_markers:
                cleaned.txn_index.append(entry)
        cleaned.sync(with_indexes=True)
        result.segments += 1
    fsync_directory(log.directory)
    result.next_delete_horizon_ms = min(horizons, default=None)
    failpoints.reach("cleaner.before-swap")
