"""The log cleaner on the storage layer: last value per key, tombstones, transactions, producer
state, crash leftovers, and a property test over produce, clean and restart."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from onceflow.log.batch import decode_records, encode_batch, encode_control_batch, validate_batches
from onceflow.log.cleaner import clean_log, plan_cleaning, swap_in, write_cleaned_segments
from onceflow.log.errors import ProducerStateError
from onceflow.log.log import PartitionLog
from onceflow.log.segment import CLEANED_SUFFIX, SWAP_SUFFIX, rename_files
from tests.log.helpers import append, open_log, read_all

NOW = 10_000_000
COMPACT = {"cleanup_policy": "compact", "segment_bytes": 400, "delete_retention_ms": 1000}


def _put(log: PartitionLog, key: str, value: str | None, timestamp: int = NOW, **producer: int) -> int:
    batch = encode_batch([(key.encode(), None if value is None else value.encode())], timestamp, **producer)
    return append(log, batch, NOW).base_offset


def _records(log: PartitionLog, start: int | None = None) -> list[tuple[int, str, str | None]]:
    """(offset, key, value) of every record, fetch by fetch as a consumer reads."""
    offset = log.log_start_offset if start is None else start
    found = []
    while data := log.read(offset, 1000):
        position = 0
        for header in validate_batches(data):
            for record in decode_records(bytes(data[position : position + header.size])):
                assert record.key is not None
                value = None if record.value is None else record.value.decode()
                found.append((record.offset, record.key.decode(), value))
            position += header.size
            offset = header.last_offset + 1
    return found


def _roll(log: PartitionLog) -> None:
    """Fill the active segment with another key so that everything before it is closed."""
    segments = log.segment_count
    while log.segment_count == segments:
        _put(log, "filler", "x" * 50)
    log.flush()


def test_keeps_the_last_value_of_each_key_at_its_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path, **COMPACT)
    written = {(key, round_): _put(log, key, f"{key}{round_}") for round_ in range(5) for key in "abc"}
    _roll(log)
    size = log.size_bytes
    result = clean_log(log, NOW, force=True)
    assert result is not None and result.records_removed >= 12
    assert log.size_bytes < size
    kept = [(offset, key, value) for offset, key, value in _records(log) if key != "filler"]
    assert kept == [(written[key, 4], key, f"{key}4") for key in "abc"]
    # A fetch at an offset that was cleaned away gets the next batch.
    assert _records(log, start=1)[0] == (written["a", 4], "a", "a4")
    assert log.log_start_offset == 0


def test_tombstones_go_after_delete_retention_ms_and_the_active_segment_is_untouched(tmp_path: Path) -> None:
    log = open_log(tmp_path, **COMPACT)
    _put(log, "old", "1")
    _put(log, "old", None, timestamp=NOW - 5000)  # older than delete.retention.ms
    _put(log, "new", "1")
    recent = _put(log, "new", None)
    _roll(log)
    active_key = _put(log, "active", "1")
    _put(log, "active", "2")
    clean_log(log, NOW, force=True)
    records = _records(log)
    assert [r for r in records if r[1] in ("old", "new")] == [(recent, "new", None)]
    assert [r[0] for r in records if r[1] == "active"] == [active_key, active_key + 1]
    # The kept tombstone makes the log due again once its horizon passes.
    assert log.next_delete_horizon_ms == NOW + 1000
    assert plan_cleaning(log, NOW) is None
    assert clean_log(log, NOW + 1001) is not None
    assert [r for r in _records(log) if r[1] == "new"] == []


def test_aborted_records_go_committed_stay_and_markers_outlive_their_data(tmp_path: Path) -> None:
    log = open_log(tmp_path, **COMPACT)
    _put(log, "k", "plain")
    committed = encode_batch([(b"k", b"committed")], NOW, 7, 0, 0, transactional=True)
    append(log, committed, NOW)
    commit_marker = append(log, encode_control_batch(7, 0, True, 0, NOW), NOW).base_offset
    aborted = encode_batch([(b"k", b"aborted")], NOW, 8, 0, 0, transactional=True)
    append(log, aborted, NOW)
    abort_marker = append(log, encode_control_batch(8, 0, False, 0, NOW - 5000), NOW).base_offset
    _roll(log)
    # Producer 8 writes on, so its aborted batch is not its last (which would stay, empty).
    append(log, encode_batch([(b"other", b"1")], NOW, 8, 0, 1), NOW)
    clean_log(log, NOW, force=True)
    assert [r for r in _records(log) if r[1] == "k"] == [(1, "k", "committed")]
    markers = [h.base_offset for s in log.segments for h, _ in s.batches() if h.is_control]
    # The commit's data is still there; the abort's is gone and its marker is past the horizon.
    assert markers == [commit_marker]
    assert abort_marker not in markers
    assert log.aborted_transactions(0, log.log_end_offset) == []


def test_producer_state_survives_cleaning_and_a_restart_without_snapshots(tmp_path: Path) -> None:
    log = open_log(tmp_path, **COMPACT)
    for sequence in range(4):
        _put(log, "k", str(sequence), producer_id=5, producer_epoch=0, base_sequence=sequence)
    _put(log, "k", "overwrites every record of producer 5")
    _roll(log)
    result = clean_log(log, NOW, force=True)
    assert result is not None and result.records_removed >= 4
    # Its last batch stays, empty, so that its sequence is not forgotten (Kafka's RETAIN_EMPTY).
    assert [
        (h.base_sequence, h.record_count) for s in log.segments for h, _ in s.batches() if h.producer_id == 5
    ] == [(3, 0)]
    log.close()
    for snapshot in tmp_path.glob("*.snapshot"):
        snapshot.unlink()  # the whole state must come from the cleaned log
    log = open_log(tmp_path, **COMPACT)
    entry = log.producer_state.get(5)
    assert entry is not None and entry.last_seq == 3
    retry = encode_batch([(b"k", b"3")], NOW, 5, 0, 3)
    assert append(log, retry, NOW).duplicate
    with pytest.raises(ProducerStateError) as refused:
        append(log, encode_batch([(b"k", b"gap")], NOW, 5, 0, 9), NOW)
    assert refused.value.error_code == ErrorCode.out_of_order_sequence_number


def test_retention_leaves_a_compact_only_log_alone(tmp_path: Path) -> None:
    log = open_log(tmp_path, **COMPACT, retention_ms=1)
    _put(log, "k", "1")
    _roll(log)
    assert log.apply_retention(NOW * 2) == 0
    both = open_log(tmp_path / "both", **{**COMPACT, "cleanup_policy": "compact,delete"}, retention_ms=1)
    _put(both, "k", "1")
    _roll(both)
    assert both.apply_retention(NOW * 2) == 1


def _interrupted_clean(directory: Path, swap_committed: bool) -> list[tuple[int, str, str | None]]:
    """Write cleaned segments, and stop as a crash would: before or after the .log swap."""
    log = open_log(directory, **COMPACT)
    for round_ in range(6):
        _put(log, "a", f"a{round_}")
        _put(log, "b", f"b{round_}")
    _roll(log)
    before = _records(log)
    plan = plan_cleaning(log, NOW, force=True)
    assert plan is not None
    result = write_cleaned_segments(plan)
    for _, cleaned in result.written:
        cleaned.close()
        rename_files(directory, cleaned.base_offset, CLEANED_SUFFIX, SWAP_SUFFIX)
        if not swap_committed:  # the .log's rename, the commit point, did not happen
            os.replace(str(cleaned.log_path).replace(CLEANED_SUFFIX, SWAP_SUFFIX), str(cleaned.log_path))
    log.close(flush=False)
    return before


@pytest.mark.parametrize("swap_committed", [False, True])
def test_a_crash_in_the_middle_of_a_clean_loses_nothing(tmp_path: Path, swap_committed: bool) -> None:
    before = _interrupted_clean(tmp_path, swap_committed)
    leftovers = [p for p in tmp_path.iterdir() if p.name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX))]
    assert leftovers
    log = open_log(tmp_path, 0, **COMPACT)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX))]
    after = _records(log)
    latest = {key: (offset, value) for offset, key, value in before}
    assert {key: (offset, value) for offset, key, value in after} == latest
    if swap_committed:
        assert len(after) < len(before)
    else:
        assert after == before


# -- property: any interleaving of produce, clean and restart keeps the latest value of every key


_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abcd"), st.one_of(st.none(), st.text("xyz", max_size=3))),
        st.tuples(st.just("clean"), st.booleans(), st.none()),
        st.tuples(st.just("restart"), st.booleans(), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=_OPERATIONS)
def test_any_interleaving_keeps_the_latest_value_of_every_key(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[str, object, object]]
) -> None:
    directory = tmp_path_factory.mktemp("prop")
    config = {**COMPACT, "segment_bytes": 150, "delete_retention_ms": 10**9}
    log = open_log(directory, **config)
    latest: dict[str, tuple[int, str | None]] = {}
    try:
        for operation, first, second in operations:
            if operation == "put":
                assert isinstance(first, str) and (second is None or isinstance(second, str))
                latest[first] = (_put(log, first, second), second)
            elif operation == "clean":
                log.flush()
                clean_log(log, NOW, force=bool(first))
            else:
                log.close(flush=bool(first))  # False: as after a kill, once fsynced
                log = open_log(directory, 0, **config)
            seen: dict[str, tuple[int, str | None]] = {}
            for offset, key, value in _records(log):
                seen[key] = (offset, value)
            assert seen == latest
    finally:
        log.close()
        shutil.rmtree(directory)


def test_a_read_from_a_log_start_in_a_gap_cleaning_left_reads_the_first_segment(tmp_path: Path) -> None:
    # compact,delete: cleaning empties the first segment (only versions of a key written again
    # later) and retention drops it; the log start stays in the gap before the next segment.
    log = open_log(
        tmp_path,
        cleanup_policy="compact,delete",
        segment_bytes=400,
        delete_retention_ms=1000,
        retention_ms=-1,
    )
    while log.segment_count == 1:
        _put(log, "a", "old" * 10)
    while log.segment_count == 2:
        _put(log, f"b{log.log_end_offset}", "keep" * 10)
    _put(log, "a", "new")
    while log.segment_count == 3:
        _put(log, f"c{log.log_end_offset}", "keep" * 10)
    log.flush()
    clean_log(log, NOW, force=True)
    log.apply_retention(NOW)
    assert log.log_start_offset < log.segments[0].base_offset  # the precondition: a start in the gap
    kept: list[int] = []
    offset = log.log_start_offset
    while data := log.read(offset, 10_000):
        headers = validate_batches(data)
        kept += [header.base_offset for header in headers]
        offset = headers[-1].last_offset + 1
    assert kept == [header.base_offset for segment in log.segments for header, _ in segment.batches()]
    log.close()


def test_a_truncation_while_a_clean_is_written_keeps_its_copies_out(tmp_path: Path) -> None:
    # A follower's truncation on the event loop, between the cleaner thread's copy and its swap:
    # the copy of the segment it cut would bring back what it cut.
    log = open_log(tmp_path, cleanup_policy="compact", segment_bytes=400, delete_retention_ms=1000)
    while log.segment_count == 1:
        _put(log, f"k{log.log_end_offset}", "v" * 30)
    _put(log, "x", "y")
    log.flush()
    plan = plan_cleaning(log, NOW, force=True)
    assert plan is not None
    written = write_cleaned_segments(plan)
    log.truncate_to(2, NOW)
    swap_in(plan, written)
    assert [header.base_offset for header in read_all(log, 0)] == [0, 1]
    assert _put(log, "new", "leader data") == 2
    log.close()
    reopened = open_log(tmp_path, cleanup_policy="compact", segment_bytes=400)
    assert reopened.log_end_offset == 3
    reopened.close()


def test_nothing_above_the_high_watermark_is_cleaned(tmp_path: Path) -> None:
    # k=v1 below it, k=v2 above it (acks=1, not yet on the followers): cleaning away v1, then
    # a leader change cutting the log at the high watermark, would leave no k at all.
    log = open_log(tmp_path, cleanup_policy="compact", segment_bytes=400, delete_retention_ms=1000)
    _put(log, "k", "v1")
    while log.segment_count == 1:
        _put(log, f"filler{log.log_end_offset}", "x" * 30)
    high_watermark = log.log_end_offset
    _put(log, "k", "v2")
    while log.segment_count == 2:
        _put(log, f"more{log.log_end_offset}", "x" * 30)
    log.flush()
    clean_log(log, NOW, force=True, below=high_watermark)
    assert [value for _, key, value in _records(log) if key == "k"] == ["v1", "v2"]
    clean_log(log, NOW, force=True)  # the control, without the bound: v1 goes
    assert [value for _, key, value in _records(log) if key == "k"] == ["v2"]
    log.close()
