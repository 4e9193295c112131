"""The idempotence rules of docs/design.md#sequence-and-epoch-rules, one by one."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from onceflow.log.batch import BatchHeader, parse_batch_header
from onceflow.log.errors import ProducerStateError
from onceflow.log.producer_state import DuplicateBatch, ProducerStateManager, list_snapshots
from tests.log.batches import idempotent, make_batch

PID = 1000
MAX_SEQ = 2**31 - 1


def header(epoch: int, base_sequence: int, count: int = 1, producer_id: int = PID) -> BatchHeader:
    return parse_batch_header(idempotent(producer_id, epoch, base_sequence, count))


class Partition:
    """Producer state plus a fake log end, appending the way PartitionLog does."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.end = 0

    def append(self, epoch: int, base_sequence: int, count: int = 1, now_ms: int = 0) -> int:
        batch = header(epoch, base_sequence, count)
        assert self.state.check_and_prepare(batch) is None
        base = self.end
        self.state.update(batch, base, now_ms)
        self.end += count
        return base

    def check(self, epoch: int, base_sequence: int, count: int = 1) -> DuplicateBatch | None:
        return self.state.check_and_prepare(header(epoch, base_sequence, count))

    def refused(self, epoch: int, base_sequence: int, count: int = 1) -> ErrorCode:
        with pytest.raises(ProducerStateError) as caught:
            self.check(epoch, base_sequence, count)
        return caught.value.error_code


def test_batches_without_a_producer_id_skip_every_check() -> None:
    partition = Partition()
    plain = parse_batch_header(make_batch(3))
    for _ in range(3):
        assert partition.state.check_and_prepare(plain) is None
        partition.state.update(plain, 0, 0)
    assert partition.state.entries() == []


def test_unknown_producer_may_start_at_any_sequence() -> None:
    partition = Partition()
    assert partition.check(epoch=3, base_sequence=12345) is None
    partition.append(epoch=3, base_sequence=12345)
    assert partition.check(epoch=3, base_sequence=12346) is None


def test_same_epoch_requires_the_next_sequence() -> None:
    partition = Partition()
    partition.append(0, 0, count=3)
    assert partition.check(0, 3) is None
    assert partition.refused(0, 4) == ErrorCode.out_of_order_sequence_number
    assert partition.refused(0, 2) == ErrorCode.out_of_order_sequence_number
    assert partition.refused(0, 1, count=2) == ErrorCode.out_of_order_sequence_number


def test_exact_retry_of_a_retained_batch_is_a_duplicate_with_the_original_offsets() -> None:
    partition = Partition()
    partition.end = 100
    partition.append(0, 0, count=2)
    partition.append(0, 2, count=3)
    assert partition.check(0, 0, count=2) == DuplicateBatch(100, 101, 1_000_001)
    assert partition.check(0, 2, count=3) == DuplicateBatch(102, 104, 1_000_002)
    # Same first sequence but a different last sequence is not the same batch.
    assert partition.refused(0, 2, count=2) == ErrorCode.out_of_order_sequence_number


def test_check_does_not_change_state() -> None:
    partition = Partition()
    partition.append(0, 0)
    for _ in range(3):
        assert partition.check(0, 1) is None
    assert partition.refused(0, 2) == ErrorCode.out_of_order_sequence_number
    entry = partition.state.get(PID)
    assert entry is not None and entry.last_seq == 0 and len(entry.batches) == 1


def test_only_the_last_five_batches_are_remembered() -> None:
    partition = Partition()
    for sequence in range(6):
        partition.append(0, sequence)
    assert partition.refused(0, 0) == ErrorCode.out_of_order_sequence_number
    for sequence in range(1, 6):
        assert partition.check(0, sequence) == DuplicateBatch(sequence, sequence, 1_000_000)


def test_lower_epoch_is_fenced_even_for_a_retry() -> None:
    partition = Partition()
    partition.append(1, 0)
    assert partition.refused(0, 0) == ErrorCode.invalid_producer_epoch
    assert partition.refused(0, 1) == ErrorCode.invalid_producer_epoch


def test_new_epoch_must_start_at_sequence_zero_and_resets_the_window() -> None:
    partition = Partition()
    partition.append(0, 0)
    partition.append(0, 1)
    assert partition.refused(1, 2) == ErrorCode.out_of_order_sequence_number
    assert partition.check(1, 0) is None
    offset = partition.append(1, 0)
    assert partition.check(1, 0) == DuplicateBatch(offset, offset, 1_000_000)
    assert partition.check(1, 1) is None
    # Old-epoch batches are gone from the window and fenced.
    assert partition.refused(0, 1) == ErrorCode.invalid_producer_epoch
    entry = partition.state.get(PID)
    assert entry is not None and entry.epoch == 1 and len(entry.batches) == 1


def test_sequences_wrap_from_int32_max_to_zero() -> None:
    partition = Partition()
    partition.append(0, MAX_SEQ - 1, count=2)  # ends at MAX_SEQ
    assert partition.refused(0, 1) == ErrorCode.out_of_order_sequence_number
    assert partition.check(0, 0) is None
    partition.append(0, 0, count=1)
    partition.append(0, 1, count=1)
    assert partition.check(0, MAX_SEQ - 1, count=2) is not None  # still a retained duplicate


def test_a_batch_spanning_the_wrap_ends_at_a_small_sequence() -> None:
    partition = Partition()
    partition.append(0, MAX_SEQ - 1, count=4)  # sequences MAX-1, MAX, 0, 1
    assert partition.state.get(PID) is not None
    assert partition.check(0, 2) is None
    assert partition.refused(0, 0) == ErrorCode.out_of_order_sequence_number
    assert isinstance(partition.check(0, MAX_SEQ - 1, count=4), DuplicateBatch)


def test_producers_expire_after_being_idle_and_then_count_as_unknown() -> None:
    partition = Partition()
    partition.append(0, 0, now_ms=1000)
    other = header(0, 0, producer_id=PID + 1)
    partition.state.update(other, 5, now_ms=5000)
    assert partition.state.remove_expired(now_ms=5999, expiration_ms=5000) == 0
    assert partition.state.remove_expired(now_ms=6000, expiration_ms=5000) == 1
    assert partition.state.get(PID) is None
    assert partition.state.get(PID + 1) is not None
    assert partition.check(0, 77) is None


def test_snapshot_round_trip_keeps_the_whole_window(tmp_path: Path) -> None:
    partition = Partition()
    for sequence in range(7):
        partition.append(2, sequence * 2, count=2, now_ms=sequence)
    partition.state.update(header(0, 0, producer_id=9), 50, now_ms=99)
    partition.state.take_snapshot(tmp_path, 60)

    restored = ProducerStateManager()
    assert restored.load_latest_snapshot(tmp_path, 60) == 60
    assert {e.producer_id: (e.epoch, list(e.batches), e.last_timestamp) for e in restored.entries()} == {
        e.producer_id: (e.epoch, list(e.batches), e.last_timestamp) for e in partition.state.entries()
    }
    assert restored.check_and_prepare(header(2, 4, count=2)) == DuplicateBatch(4, 5, 1_000_001)


def test_load_picks_the_newest_readable_snapshot_at_or_below_the_log_end(tmp_path: Path) -> None:
    state = ProducerStateManager()
    for offset in (10, 20, 30):
        state.update(header(0, offset), offset, now_ms=offset)
        state.take_snapshot(tmp_path, offset)
    # A torn snapshot is skipped and removed; one above the log end describes lost data.
    torn = list_snapshots(tmp_path)[1]
    torn.write_bytes(torn.read_bytes()[:-3])

    restored = ProducerStateManager()
    assert restored.load_latest_snapshot(tmp_path, 25) == 10
    entry = restored.get(PID)
    assert entry is not None and entry.last_seq == 10
    assert [path.name for path in list_snapshots(tmp_path)] == ["00000000000000000010.snapshot"]

    assert ProducerStateManager().load_latest_snapshot(tmp_path, 5) == 0
    assert list_snapshots(tmp_path) == []


def test_only_the_newest_snapshots_are_kept(tmp_path: Path) -> None:
    state = ProducerStateManager()
    for offset in range(0, 60, 10):
        state.take_snapshot(tmp_path, offset)
    assert [int(path.stem) for path in list_snapshots(tmp_path)] == [30, 40, 50]
