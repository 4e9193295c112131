"""Reopening a log after clean shutdowns, crashes, torn writes and damaged files.

A crash is simulated with `close(flush=False)`: the files keep what was written (as the page
cache does after a process kill) but nothing of a clean shutdown happens.
"""

from __future__ import annotations

import struct
from pathlib import Path

from onceflow.log import loader
from onceflow.log.batch import validate_batches
from onceflow.log.log import AppendResult, PartitionLog
from onceflow.log.producer_state import list_snapshots
from tests.log.batches import idempotent, make_batch
from tests.log.helpers import append, open_log, read_all, segment_files


def batch_positions(path: Path) -> list[tuple[int, int, int]]:
    """(position, base offset, size) of each batch in a segment file."""
    positions = []
    position = 0
    for header in validate_batches(path.read_bytes()):
        positions.append((position, header.base_offset, header.size))
        position += header.size
    return positions


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(data)


def payload_byte_of(path: Path, batch: int) -> tuple[int, int]:
    """A position inside the record values of the `batch`-th batch, and that batch's offset:
    corrupting it breaks the CRC but not the header."""
    position, base_offset, size = batch_positions(path)[batch]
    return position + size - 3, base_offset


def index_entries(path: Path) -> list[tuple[int, int]]:
    return list(struct.iter_unpack(">ii", path.read_bytes()))


def fill(log: PartitionLog, batches: int, value_size: int = 40) -> None:
    for _ in range(batches):
        append(log, make_batch(2, value_size=value_size))


def test_a_fresh_directory_is_an_empty_partition(tmp_path: Path) -> None:
    log = open_log(tmp_path / "topic-0", recovery_point=123)
    assert (log.log_start_offset, log.log_end_offset, log.flushed_offset) == (0, 0, 0)
    assert log.read(0, 100) == b""


def test_clean_shutdown_reopens_everything(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=400, index_interval_bytes=50)
    fill(log, 40)
    before = read_all(log)
    log.close()
    indexes = {path.name: path.read_bytes() for path in segment_files(tmp_path, "index")}

    reopened = open_log(tmp_path, recovery_point=80, segment_bytes=400, index_interval_bytes=50)
    assert (reopened.log_start_offset, reopened.log_end_offset, reopened.flushed_offset) == (0, 80, 80)
    assert read_all(reopened) == before
    assert {path.name: path.read_bytes() for path in segment_files(tmp_path, "index")} == indexes
    assert append(reopened, make_batch()).base_offset == 80


def test_segments_below_the_recovery_point_are_trusted_not_rescanned(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=400, index_interval_bytes=50)
    fill(log, 40)
    log.close()
    first_segment = segment_files(tmp_path)[0]
    damaged_batch_start = batch_positions(first_segment)[1][0]
    position, damaged_offset = payload_byte_of(first_segment, 1)
    flip_byte(first_segment, position)

    trusted = open_log(tmp_path, recovery_point=80)
    assert trusted.log_end_offset == 80  # the damage went unseen: the segment was not re-read
    trusted.close()

    rescanned = open_log(tmp_path, recovery_point=0)
    assert rescanned.log_end_offset == damaged_offset
    assert segment_files(tmp_path) == [first_segment]
    assert first_segment.stat().st_size == damaged_batch_start


def test_a_torn_tail_is_cut_at_the_last_whole_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path, index_interval_bytes=100)
    fill(log, 20)
    flushed = log.flush()
    fill(log, 10)
    log.close(flush=False)
    segment = segment_files(tmp_path)[0]
    position, base_offset, _ = batch_positions(segment)[25]
    with segment.open("r+b") as file:
        file.truncate(position + 30)

    reopened = open_log(tmp_path, recovery_point=flushed, index_interval_bytes=100)
    assert reopened.log_end_offset == base_offset == 50
    assert segment.stat().st_size == position
    assert [h.base_offset for h in read_all(reopened)] == list(range(0, 50, 2))
    assert all(
        entry_position < position for _, entry_position in index_entries(segment.with_suffix(".index"))
    )
    assert append(reopened, make_batch()) == AppendResult(50, 50)
    assert len(read_all(reopened)) == 26


def test_a_torn_batch_header_is_cut_too(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 3)
    log.close(flush=False)
    segment = segment_files(tmp_path)[0]
    position = batch_positions(segment)[2][0]
    with segment.open("r+b") as file:
        file.truncate(position + 5)
    assert open_log(tmp_path).log_end_offset == 4
    assert segment.stat().st_size == position


def test_corruption_after_the_recovery_point_truncates_there_and_drops_later_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=400, index_interval_bytes=50)
    fill(log, 15)
    flushed = log.flush()
    fill(log, 40)
    log.close(flush=False)
    segments = segment_files(tmp_path)
    damaged = segments[-3]
    assert int(damaged.stem) > flushed
    position, damaged_offset = payload_byte_of(damaged, 1)
    flip_byte(damaged, position)

    reopened = open_log(tmp_path, recovery_point=flushed, segment_bytes=400, index_interval_bytes=50)
    assert reopened.log_end_offset == damaged_offset
    assert segment_files(tmp_path) == segments[:-2]
    assert damaged.stat().st_size == batch_positions(damaged)[-1][0] + batch_positions(damaged)[-1][2]
    assert [h.base_offset for h in read_all(reopened)] == list(range(0, damaged_offset, 2))
    # Later segments' snapshots described data that is gone.
    assert all(int(path.stem) <= damaged_offset for path in list_snapshots(tmp_path))


def test_corruption_at_an_indexed_batch_rebuilds_that_segment_index(tmp_path: Path) -> None:
    log = open_log(tmp_path, index_interval_bytes=150)
    for timestamp in range(1000, 1030):
        append(log, make_batch(2, timestamp=timestamp, value_size=40))
    log.close(flush=False)
    segment = segment_files(tmp_path)[0]
    entries = index_entries(segment.with_suffix(".index"))
    relative_offset, position = entries[2]
    flip_byte(segment, position + 70)

    reopened = open_log(tmp_path, recovery_point=relative_offset, index_interval_bytes=150)
    assert reopened.log_end_offset == relative_offset
    assert index_entries(segment.with_suffix(".index")) == entries[:2]
    timestamps = list(struct.iter_unpack(">qi", segment.with_suffix(".timeindex").read_bytes()))
    assert all(offset < relative_offset for _, offset in timestamps)
    last = read_all(reopened)[-1]
    assert reopened.offset_for_timestamp(last.max_timestamp) == (last.last_offset, last.max_timestamp)
    assert reopened.offset_for_timestamp(last.max_timestamp + 1) is None


def test_missing_or_damaged_index_files_of_trusted_segments_are_rebuilt(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=600, index_interval_bytes=50)
    fill(log, 40)
    end = log.log_end_offset
    log.close()
    indexes = {path.name: path.read_bytes() for path in segment_files(tmp_path, "index")}
    time_indexes = {path.name: path.read_bytes() for path in segment_files(tmp_path, "timeindex")}
    first, second, third = segment_files(tmp_path, ".index")[:3]
    first.unlink()
    second.write_bytes(second.read_bytes() + b"\x01\x02\x03")
    third.write_bytes(third.read_bytes() + bytes(8))  # a zero-filled torn entry
    segment_files(tmp_path, ".timeindex")[0].unlink()

    reopened = open_log(tmp_path, recovery_point=end, segment_bytes=600, index_interval_bytes=50)
    assert reopened.log_end_offset == end
    assert {path.name: path.read_bytes() for path in segment_files(tmp_path, "index")} == indexes
    assert {path.name: path.read_bytes() for path in segment_files(tmp_path, "timeindex")} == time_indexes
    assert len(read_all(reopened)) == 40


def test_an_index_pointing_past_a_shortened_log_is_rebuilt(tmp_path: Path) -> None:
    log = open_log(tmp_path, index_interval_bytes=100)
    fill(log, 30)
    log.close()
    segment = segment_files(tmp_path)[0]
    relative_offset, position = index_entries(segment.with_suffix(".index"))[3]
    with segment.open("r+b") as file:
        file.truncate(position)

    reopened = open_log(tmp_path, recovery_point=60, index_interval_bytes=100)
    assert reopened.log_end_offset == relative_offset
    assert all(
        entry_position < position for _, entry_position in index_entries(segment.with_suffix(".index"))
    )
    assert len(read_all(reopened)) == relative_offset // 2


def test_stray_index_files_without_a_log_are_removed(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 2)
    log.close()
    stray = tmp_path / "00000000000000000100.index"
    stray.write_bytes(bytes(8))
    open_log(tmp_path, recovery_point=4).close()
    assert not stray.exists()


def _produce_sequences(log: PartitionLog, sequences: range) -> list[AppendResult]:
    return [append(log, idempotent(7, 0, sequence, value_size=40)) for sequence in sequences]


def test_producer_state_survives_a_crash_via_snapshot_and_replay(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    results = _produce_sequences(log, range(13))
    assert list_snapshots(tmp_path)  # rolls took snapshots
    log.close(flush=False)

    reopened = open_log(tmp_path, segment_bytes=300)
    for sequence in (8, 12):  # still within the last five batches
        retry = append(reopened, idempotent(7, 0, sequence, value_size=40))
        assert retry == AppendResult(
            results[sequence].base_offset, results[sequence].last_offset, duplicate=True
        )
    assert append(reopened, idempotent(7, 0, 13)).base_offset == 13


def test_producer_state_is_rebuilt_from_the_log_alone_when_snapshots_are_lost(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    results = _produce_sequences(log, range(13))
    log.close(flush=False)
    for snapshot in list_snapshots(tmp_path):
        snapshot.unlink()

    reopened = open_log(tmp_path, segment_bytes=300)
    assert append(reopened, idempotent(7, 0, 12, value_size=40)).duplicate
    assert results[12].base_offset == 12
    entry = reopened.producer_state.get(7)
    assert entry is not None and [batch.first_seq for batch in entry.batches] == [8, 9, 10, 11, 12]


def test_a_clean_shutdown_snapshot_keeps_the_whole_window(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    results = _produce_sequences(log, range(6))
    log.close()
    reopened = open_log(tmp_path, recovery_point=6)
    assert append(reopened, idempotent(7, 0, 1, value_size=40)) == AppendResult(
        results[1].base_offset, results[1].last_offset, duplicate=True
    )


def test_producer_state_forgets_batches_that_recovery_cut_off(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    _produce_sequences(log, range(13))
    log.close(flush=False)
    segments = segment_files(tmp_path)
    position, damaged_offset = payload_byte_of(segments[1], 0)
    flip_byte(segments[1], position)

    reopened = open_log(tmp_path, segment_bytes=300)
    assert reopened.log_end_offset == damaged_offset
    # The producer's cut-off batch is neither a duplicate nor out of order: it is next.
    assert append(reopened, idempotent(7, 0, damaged_offset, value_size=40)) == AppendResult(
        damaged_offset, damaged_offset
    )


def test_idle_producers_expire_when_the_log_is_opened(tmp_path: Path) -> None:
    log = open_log(tmp_path, producer_id_expiration_ms=1000)
    append(log, idempotent(7, 0, 0), now_ms=5000)
    log.close()
    assert open_log(
        tmp_path, recovery_point=1, now_ms=5999, producer_id_expiration_ms=1000
    ).producer_state.get(7)
    assert (
        open_log(tmp_path, recovery_point=1, now_ms=6000, producer_id_expiration_ms=1000).producer_state.get(
            7
        )
        is None
    )


def test_a_periodic_snapshot_bounds_the_replay_after_a_crash(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    log = open_log(tmp_path)
    _produce_sequences(log, range(4))
    writer = log.producer_snapshot_writer()
    assert writer is not None and log.producer_snapshot_writer() is None  # nothing new since
    writer()
    _produce_sequences(log, range(4, 6))
    log.close(flush=False)
    replayed = _count_replays(monkeypatch)
    reopened = open_log(tmp_path, recovery_point=4)  # a checkpoint taken after the snapshot
    assert replayed == [4]  # the replay starts at the snapshot, not at offset 0
    assert append(reopened, idempotent(7, 0, 5)).duplicate
    assert append(reopened, idempotent(7, 0, 6)).base_offset == 6


def test_a_snapshot_past_the_recovery_point_is_not_replayed_from(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Written before what is below it was known to be fsynced (the transaction index's abort
    # entries among it): a replay from there could miss aborts a crash took back.
    log = open_log(tmp_path)
    _produce_sequences(log, range(4))
    writer = log.producer_snapshot_writer()
    assert writer is not None
    writer()
    log.close(flush=False)
    replayed = _count_replays(monkeypatch)
    reopened = open_log(tmp_path, recovery_point=2)
    assert replayed == [0]
    assert append(reopened, idempotent(7, 0, 3)).duplicate  # the state rebuilt all the same


def _count_replays(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """The offsets the next opened log's producer-state replay starts from."""
    replayed: list[int] = []
    original = loader._batches_from

    def counting(segments, offset: int):  # type: ignore[no-untyped-def]
        replayed.append(offset)
        return original(segments, offset)

    monkeypatch.setattr(loader, "_batches_from", counting)
    return replayed
