"""Leader epochs (KIP-101/279): the cache's lookups, the follower's truncation point, the
checkpoint file, and truncating a partition's log. No sockets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.log.batch import patch_partition_leader_epoch, validate_batches
from onceflow.log.leader_epochs import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    EpochEntry,
    LeaderEpochCache,
    LeaderEpochCheckpoint,
    Truncation,
    truncation_point,
)
from onceflow.log.log import AppendResult, PartitionLog
from tests.log.batches import idempotent, make_batch
from tests.log.helpers import append, open_log, read_all


def cache(*entries: tuple[int, int]) -> LeaderEpochCache:
    return LeaderEpochCache([EpochEntry(*entry) for entry in entries])


def stamped(count: int, leader_epoch: int, sequence: int | None = None) -> bytearray:
    """A batch stamped with `leader_epoch`; with a `sequence`, from idempotent producer 7."""
    batch = make_batch(count) if sequence is None else idempotent(7, 0, sequence, count)
    patch_partition_leader_epoch(batch, 0, leader_epoch)
    return batch


def replicate(log: PartitionLog, batch: bytearray) -> AppendResult:
    """Append as a follower does: the batch's leader epoch goes in the cache."""
    return log.append(batch, validate_batches(batch), 0, replicated=True)


def test_the_end_offset_of_an_epoch_is_where_the_next_one_began() -> None:
    epochs = cache((1, 0), (3, 10), (4, 25))
    assert epochs.end_offset_for(4, log_end_offset=30) == (4, 30)  # the latest: the log end
    assert epochs.end_offset_for(3, 30) == (3, 25)
    assert epochs.end_offset_for(2, 30) == (1, 10)  # unknown: the largest epoch below it
    assert epochs.end_offset_for(0, 30) == (0, 0)  # older than all: where the first began
    assert epochs.end_offset_for(5, 30) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert epochs.end_offset_for(-1, 30) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache().end_offset_for(0, 30) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def test_assigning_keeps_epochs_and_offsets_increasing() -> None:
    epochs = cache((1, 0), (2, 10))
    assert not epochs.assign(2, 15) and not epochs.assign(1, 20)  # not newer
    assert epochs.assign(5, 8)  # after a truncation to 8: epoch 2 began past it
    assert epochs.entries == [EpochEntry(1, 0), EpochEntry(5, 8)]
    assert epochs.truncate_from_end(8) and epochs.entries == [EpochEntry(1, 0)]
    assert not epochs.truncate_from_end(8)


def test_a_follower_cuts_its_divergent_suffix() -> None:
    # The old leader wrote offsets 10-14 in epoch 2; the new leader (epoch 3) began at 10.
    follower = cache((1, 0), (2, 5))
    assert truncation_point(follower, 15, 8, leader_epoch=2, leader_end=10) == Truncation(10, True)
    # The follower is behind, not divergent: it keeps everything.
    assert truncation_point(follower, 9, 8, leader_epoch=2, leader_end=10) == Truncation(9, True)


def test_an_epoch_the_follower_never_had_takes_two_rounds() -> None:
    # Leader: epochs 1 at 0, 2 at 4, 4 at 9. Follower: 1 at 0, then led epoch 3 alone from 5.
    follower = cache((1, 0), (3, 5))
    # Asked for epoch 3, the leader answers epoch 2, ending at 9: the follower has no epoch 2.
    first = truncation_point(follower, 12, 3, leader_epoch=2, leader_end=9)
    assert first == Truncation(5, False)  # the end of its epoch 1; then ask again for epoch 1
    follower.truncate_from_end(first.offset)
    assert truncation_point(follower, 5, 3, leader_epoch=1, leader_end=4) == Truncation(4, True)


def test_without_epochs_the_follower_falls_back_to_the_high_watermark() -> None:
    assert truncation_point(cache(), 12, 4, leader_epoch=2, leader_end=20) == Truncation(4, True)
    assert truncation_point(cache((1, 0)), 12, 4, UNDEFINED_EPOCH, UNDEFINED_OFFSET) == Truncation(4, True)


def test_the_checkpoint_survives_and_a_bad_one_is_ignored(tmp_path: Path) -> None:
    checkpoint = LeaderEpochCheckpoint(tmp_path)
    assert checkpoint.read() == cache()
    checkpoint.write(cache((1, 0), (4, 7)))
    assert checkpoint.path.read_text() == "0\n2\n1 0\n4 7\n"
    assert checkpoint.read() == cache((1, 0), (4, 7))
    checkpoint.path.write_text("0\n3\n1 0\n")
    assert checkpoint.read() == cache()


def test_appending_stamped_batches_records_epochs_and_truncation_cuts_them(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)  # several segments
    replicate(log, stamped(2, 1, sequence=0))  # offsets 0-1
    for _ in range(3):
        replicate(log, stamped(2, 1))  # 2-7
    replicate(log, stamped(2, 2, sequence=2))  # 8-9
    replicate(log, stamped(3, 2))  # 10-12
    log.assign_leader_epoch(5)  # a new leader at its log end
    assert log.leader_epochs == cache((1, 0), (2, 8), (5, 13))
    assert log.segment_count > 2
    assert log.flush() == 13

    log.truncate_to(8, now_ms=0)
    assert (log.log_end_offset, log.flushed_offset) == (8, 8)
    assert [header.last_offset for header in read_all(log)] == [1, 3, 5, 7]
    assert log.leader_epochs == cache((1, 0))
    # The producer's sequence 2 is gone with its batch: the same batch is new again, not a duplicate.
    again = replicate(log, stamped(2, 6, sequence=2))
    assert (again.base_offset, again.duplicate) == (8, False)
    log.close()

    reopened = open_log(tmp_path, recovery_point=10, segment_bytes=300)
    assert reopened.log_end_offset == 10
    assert reopened.leader_epochs == cache((1, 0), (6, 8))
    assert [header.last_offset for header in read_all(reopened)] == [1, 3, 5, 7, 9]
    reopened.close()


def test_truncating_to_the_log_start_empties_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    replicate(log, stamped(3, 1))
    log.truncate_to(0, now_ms=0)
    assert (log.log_end_offset, read_all(log), log.leader_epochs) == (0, [], cache())
    assert append(log, make_batch(1)).base_offset == 0
    log.close()


def test_a_follower_behind_its_leaders_log_start_starts_again_there(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    for _ in range(4):
        replicate(log, stamped(2, 1, sequence=0))  # 0-7, one idempotent producer
    log.truncate_fully_and_start_at(20)
    assert (log.log_start_offset, log.log_end_offset, log.flushed_offset) == (20, 20, 20)
    assert (read_all(log), log.leader_epochs, log.segment_count) == ([], cache(), 1)
    # The producer state went with the data: its sequence 0 is new again.
    assert replicate(log, stamped(2, 3, sequence=0)).base_offset == 20
    assert log.flush() == 22
    log.close()

    reopened = open_log(tmp_path, recovery_point=22, segment_bytes=300)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (20, 22)
    assert reopened.leader_epochs == cache((3, 20))
    assert [header.last_offset for header in read_all(reopened)] == [21]
    reopened.close()


def test_a_producer_snapshot_captured_before_a_truncation_is_not_written(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, stamped(2, 1, sequence=0))
    writer = log.producer_snapshot_writer()
    assert writer is not None
    log.truncate_to(0, now_ms=0)
    writer()
    assert list(tmp_path.glob("*.snapshot")) == []
    log.close(flush=False)


def test_a_clients_stamped_epoch_is_not_a_leader_epoch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, stamped(1, 5))  # librdkafka stamps 0, others may stamp anything
    assert log.leader_epochs == cache()
    log.close()


def test_a_new_epoch_is_written_by_the_next_flush_not_on_the_appending_thread(tmp_path: Path) -> None:
    """A broker's death gives every partition it was in sync for a new epoch at once: an fsync
    each on the event loop held a leader for seconds under disk load."""
    log = open_log(tmp_path)
    replicate(log, stamped(2, 1))
    assert log.flush() == 2
    checkpoint = tmp_path / "leader-epoch-checkpoint"
    written = checkpoint.read_text()
    assert written == "0\n1\n1 0\n"
    log.assign_leader_epoch(5)
    append(log, make_batch(1))
    assert checkpoint.read_text() == written  # nothing written yet
    assert log.begin_data_flush() is None  # the lone fdatasync would not write it
    assert log.flush() == 3
    assert checkpoint.read_text() == "0\n2\n1 0\n5 2\n"
    log.close()


def test_epochs_the_checkpoint_missed_in_a_crash_are_found_in_the_replayed_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    replicate(log, stamped(2, 1))
    assert log.flush() == 2
    replicate(log, stamped(3, 4))  # offsets 2-4, epoch 4: the crash comes before its flush
    log.close(flush=False)

    reopened = open_log(tmp_path, recovery_point=2)
    assert reopened.log_end_offset == 5
    assert reopened.leader_epochs == cache((1, 0))  # the checkpoint as last written
    reopened.adopt_replayed_epochs()  # a cluster's partition: its leaders stamp their epochs
    assert reopened.leader_epochs == cache((1, 0), (4, 2))
    assert reopened.flush() == 5
    reopened.close()
    assert open_log(tmp_path, recovery_point=5).leader_epochs == cache((1, 0), (4, 2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    counts=st.lists(st.integers(1, 5), min_size=2, max_size=12),
    index_interval_bytes=st.sampled_from([1, 60, 150, 4096]),
    segment_bytes=st.sampled_from([250, 1_000_000]),
    data=st.data(),
)
def test_a_cut_at_any_batch_then_the_new_leaders_batches_leave_no_hole(
    tmp_path_factory: pytest.TempPathFactory,
    counts: list[int],
    index_interval_bytes: int,
    segment_bytes: int,
    data: st.DataObject,
) -> None:
    """Seen in a cluster soak: a cut exactly at a batch with an index entry of its own left the
    segment's end where it was, so the follower's log end stayed past the cut and its next append
    went after a hole of zeros. Each batch's index entry or none, one segment or several, the cut
    lands on any batch."""
    directory = tmp_path_factory.mktemp("log")
    config = {"index_interval_bytes": index_interval_bytes, "segment_bytes": segment_bytes}
    log = open_log(directory, **config)
    for count in counts:
        replicate(log, stamped(count, 1))
    starts = [header.base_offset for header in read_all(log)]
    cut = data.draw(st.sampled_from(starts[1:]))
    log.truncate_to(cut, now_ms=0)
    assert log.log_end_offset == cut and [h.last_offset for h in read_all(log)][-1] == cut - 1
    assert replicate(log, stamped(2, 2)).base_offset == cut  # the new leader's batch, right there
    expected = [(h.base_offset, h.last_offset) for h in read_all(log)]
    assert [first for first, _ in expected[1:]] == [last + 1 for _, last in expected[:-1]]
    assert expected[-1] == (cut, cut + 1)
    end = log.flush()
    log.close()
    reopened = open_log(directory, recovery_point=end, **config)
    assert [(h.base_offset, h.last_offset) for h in read_all(reopened)] == expected
    reopened.close()
