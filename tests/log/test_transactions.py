"""Transactions on one partition: LSO, markers, the aborted-transaction index, and recovery."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest
from crc32c import crc32c
from kio.schema.errors import ErrorCode

from onceflow.log.batch import encode_control_batch
from onceflow.log.errors import LogAppendError, ProducerStateError
from onceflow.log.log import PartitionLog
from tests.log.batches import TRANSACTIONAL, idempotent, make_batch
from tests.log.helpers import append, open_log


def _txn(log: PartitionLog, producer_id: int, sequence: int, epoch: int = 0, count: int = 2) -> int:
    batch = idempotent(producer_id, epoch, sequence, count=count, attributes=TRANSACTIONAL)
    return append(log, batch).base_offset


def _marker(log: PartitionLog, producer_id: int, commit: bool, epoch: int = 0) -> int:
    return append(log, encode_control_batch(producer_id, epoch, commit, 0, 1000)).base_offset


def _aborted(log: PartitionLog, start: int = 0, end: int = 10**9) -> list[tuple[int, int]]:
    return [(entry.producer_id, entry.first_offset) for entry in log.aborted_transactions(start, end)]


def test_the_lso_waits_for_the_oldest_open_transaction(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, make_batch(2))  # 0-1, not transactional
    assert log.last_stable_offset(log.log_end_offset) == 2
    assert _txn(log, 1, 0) == 2  # 2-3
    assert _txn(log, 2, 0) == 4  # 4-5
    assert log.last_stable_offset(log.log_end_offset) == 2
    assert _marker(log, 1, commit=True) == 6
    assert log.last_stable_offset(log.log_end_offset) == 4
    assert _marker(log, 2, commit=False) == 7
    assert log.last_stable_offset(log.log_end_offset) == 8
    assert log.last_stable_offset(5) == 5  # never past the high watermark


def test_only_aborts_are_indexed_and_found_by_range(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _txn(log, 1, 0)  # 0-1
    _marker(log, 1, commit=False)  # 2
    _txn(log, 2, 0)  # 3-4
    _marker(log, 2, commit=True)  # 5
    _txn(log, 1, 2)  # 6-7
    _marker(log, 1, commit=False)  # 8
    assert _aborted(log) == [(1, 0), (1, 6)]
    assert _aborted(log, 3, 6) == []  # neither aborted transaction has data in [3, 6)
    assert _aborted(log, 2, 7) == [(1, 0), (1, 6)]  # the first one's marker is at 2
    assert _aborted(log, 9) == []
    assert (tmp_path / "00000000000000000000.txnindex").stat().st_size == 2 * 34


def test_interleaved_transactions_keep_their_own_first_offsets(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _txn(log, 1, 0)  # 0-1
    _txn(log, 2, 0)  # 2-3
    _txn(log, 1, 2)  # 4-5
    _marker(log, 1, commit=False)  # 6
    assert _aborted(log) == [(1, 0)]
    assert log.last_stable_offset(log.log_end_offset) == 2
    entry = log.aborted_transactions(0, 10)[0]
    assert (entry.last_offset, entry.last_stable_offset) == (6, 2)


def test_a_marker_from_an_older_epoch_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _txn(log, 1, 0, epoch=3)
    with pytest.raises(ProducerStateError) as refused:
        _marker(log, 1, commit=True, epoch=2)
    assert refused.value.error_code == ErrorCode.invalid_producer_epoch


def test_an_abort_marker_with_a_bumped_epoch_fences_the_old_epoch(tmp_path: Path) -> None:
    """The coordinator's timeout abort writes the marker with epoch + 1."""
    log = open_log(tmp_path)
    _txn(log, 1, 0, epoch=0)
    _marker(log, 1, commit=False, epoch=1)
    with pytest.raises(ProducerStateError) as zombie:
        _txn(log, 1, 2, epoch=0)
    assert zombie.value.error_code == ErrorCode.invalid_producer_epoch
    assert _txn(log, 1, 0, epoch=1) == 3  # the new session starts again at sequence 0


@pytest.mark.parametrize("snapshot_at", [None, "middle", "end"])
def test_open_transactions_and_aborts_survive_a_crash(tmp_path: Path, snapshot_at: str | None) -> None:
    log = open_log(tmp_path, segment_bytes=400)
    _txn(log, 1, 0)
    _marker(log, 1, commit=False)
    if snapshot_at == "middle":
        writer = log.producer_snapshot_writer()
        assert writer is not None
        writer()
    _txn(log, 2, 0)
    _txn(log, 1, 2)
    _marker(log, 1, commit=False)
    _txn(log, 3, 0)
    _marker(log, 3, commit=True)
    if snapshot_at == "end":
        writer = log.producer_snapshot_writer()
        assert writer is not None
        writer()
    expected_aborted = _aborted(log)
    expected_lso = log.last_stable_offset(log.log_end_offset)
    log.close(flush=False)

    reopened = open_log(tmp_path, segment_bytes=400)
    assert _aborted(reopened) == expected_aborted == [(1, 0), (1, 5)]
    assert reopened.last_stable_offset(reopened.log_end_offset) == expected_lso == 3
    _marker(reopened, 2, commit=True)
    assert reopened.last_stable_offset(reopened.log_end_offset) == reopened.log_end_offset


def test_a_lost_marker_drops_its_index_entry(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _txn(log, 1, 0)
    _marker(log, 1, commit=False)
    log.close(flush=False)
    segment = tmp_path / "00000000000000000000.log"
    with open(segment, "r+b") as file:
        file.truncate(segment.stat().st_size - 5)  # the marker is torn away
    reopened = open_log(tmp_path)
    assert _aborted(reopened) == []
    assert reopened.last_stable_offset(reopened.log_end_offset) == 0  # the transaction is open again


def test_producers_with_open_transactions_do_not_expire(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _txn(log, 1, 0)
    append(log, idempotent(2, 0, 0))
    assert log.producer_state.remove_expired(now_ms=10**12, expiration_ms=1) == 1
    assert log.producer_state.get(1) is not None and log.producer_state.get(2) is None


def test_retention_forgets_aborts_in_deleted_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300, retention_bytes=300)
    _txn(log, 1, 0)
    _marker(log, 1, commit=False)
    for sequence in range(0, 40, 2):
        append(log, idempotent(9, 0, sequence, count=2))
    log.apply_retention(now_ms=0)
    assert log.log_start_offset > 2
    assert _aborted(log) == []


def test_an_abort_appended_while_the_transaction_index_syncs_is_durable_after_the_next_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fsync thread syncs `.txnindex` while the event loop appends another ABORT: that
    entry must leave the index dirty, so that the next flush fsyncs it."""
    log = open_log(tmp_path)
    _txn(log, 1, 0)
    _marker(log, 1, commit=False)
    real_fsync = os.fsync
    synced_entries: list[int] = []  # the entries on disk at each fsync of the index

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(".txnindex"):
            return
        synced_entries.append(len(log.aborted_transactions(0, 10**9)))
        if len(synced_entries) == 1:  # during the first sync, as the event loop would
            _txn(log, 2, 0)
            _marker(log, 2, commit=False)

    monkeypatch.setattr(os, "fsync", fsync)
    log.flush()
    assert synced_entries == [1]
    log.flush()
    assert synced_entries == [1, 2]


def test_an_abort_whose_index_file_cannot_be_opened_changes_nothing(tmp_path: Path) -> None:
    # The finding: with no descriptor left, the ABORT marker went in and its index entry did
    # not, and read_committed readers were given the aborted records.
    log = open_log(tmp_path)
    _txn(log, 1, 0)
    _txn(log, 2, 0)
    end, unstable = log.log_end_offset, log.producer_state.first_unstable_offset()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)  # descriptors are numbered from the lowest free
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # not one descriptor more
    try:
        with pytest.raises(LogAppendError) as refused:
            _marker(log, 1, commit=False)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert refused.value.error_code == ErrorCode.kafka_storage_error
    assert (log.log_end_offset, log.producer_state.first_unstable_offset()) == (end, unstable)
    assert _aborted(log) == [] and log.last_stable_offset(end) == 0
    marker_offset = _marker(log, 1, commit=False)  # the coordinator's retry, once there is one
    assert _aborted(log) == [(1, 0)] and marker_offset == end


def _marked_by(log: PartitionLog, producer_id: int, coordinator_epoch: int, commit: bool = True) -> None:
    """A marker as the coordinator of `coordinator_epoch` writes it: checked first."""
    log.producer_state.check_coordinator_epoch(producer_id, coordinator_epoch)
    append(log, encode_control_batch(producer_id, 0, commit, coordinator_epoch, 1000))


def _refused(log: PartitionLog, producer_id: int, coordinator_epoch: int) -> ErrorCode:
    with pytest.raises(ProducerStateError) as refused:
        log.producer_state.check_coordinator_epoch(producer_id, coordinator_epoch)
    return refused.value.error_code


@pytest.mark.parametrize("reopen", ["snapshot", "replay", "truncation"])
def test_a_marker_from_an_older_coordinator_is_fenced_also_after_a_restart(
    tmp_path: Path, reopen: str
) -> None:
    """The coordinator epoch each producer's last marker carried survives a restart, from the
    snapshot or from the markers replayed, and a cut that keeps the marker."""
    log = open_log(tmp_path)
    _txn(log, 1, 0)  # 0-1
    _marked_by(log, 1, coordinator_epoch=3)  # 2
    _txn(log, 1, 2)  # 3-4, the next transaction, open
    _marked_by(log, 2, coordinator_epoch=7)  # 5: a producer whose first record here is its marker
    assert _refused(log, 1, 2) == ErrorCode.transaction_coordinator_fenced
    log.producer_state.check_coordinator_epoch(1, 3)  # the same coordinator may retry
    if reopen == "truncation":
        _txn(log, 3, 0)  # 6-7
        log.truncate_to(6, 0)  # rebuilds the producer state by replaying the markers
    else:
        end = log.log_end_offset
        log.close(flush=reopen == "snapshot")
        for snapshot in [] if reopen == "snapshot" else tmp_path.glob("*.snapshot"):
            snapshot.unlink()
        # From the snapshot at the end (a clean shutdown's, below the recovery point), or by
        # replaying every batch from the start.
        log = open_log(tmp_path, recovery_point=end if reopen == "snapshot" else 0)
    assert _refused(log, 1, 2) == ErrorCode.transaction_coordinator_fenced
    assert _refused(log, 2, 6) == ErrorCode.transaction_coordinator_fenced
    _marked_by(log, 1, coordinator_epoch=4)  # a newer coordinator ends the open one
    assert _refused(log, 1, 3) == ErrorCode.transaction_coordinator_fenced
    assert log.last_stable_offset(log.log_end_offset) == log.log_end_offset


def test_a_version_2_producer_snapshot_is_read_without_coordinator_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    _txn(log, 1, 0)
    log.close()
    [snapshot] = list(tmp_path.glob("*.snapshot"))
    data = snapshot.read_bytes()
    # Version 3: magic, version, count (10 bytes); the producer: id, epoch, last timestamp, open
    # transaction (26 bytes), coordinator epoch (4), batch count (1); its batches; the CRC.
    assert data[4:6] == (3).to_bytes(2, "big") and data[36:40] == (-1).to_bytes(4, "big", signed=True)
    body = data[:4] + (2).to_bytes(2, "big") + data[6:36] + data[40:-4]  # version 2: no coordinator epoch
    snapshot.write_bytes(body + crc32c(body).to_bytes(4, "big"))
    log = open_log(tmp_path)
    entry = log.producer_state.get(1)
    assert entry is not None and entry.current_txn_first_offset == 0 and entry.coordinator_epoch == -1
