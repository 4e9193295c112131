"""`PartitionLog.begin_data_flush`: the common flush as one fdatasync that the caller runs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from onceflow.log.batch import encode_control_batch
from onceflow.log.log import DataFlush, PartitionLog
from tests.log.batches import TRANSACTIONAL, idempotent, make_batch
from tests.log.helpers import append, open_log, segment_files


def _flushed_log(directory: Path, **config: int) -> PartitionLog:
    """A log with data whose segment's directory entry is synced: what a broker has after its
    first flush."""
    log = open_log(directory, **config)
    append(log, make_batch(2))
    log.flush()
    return log


def _pending_flush(log: PartitionLog) -> DataFlush:
    """Three more records (offsets 2-4) and the data flush that covers them, begun."""
    append(log, make_batch(3))
    data_flush = log.begin_data_flush()
    assert data_flush is not None
    return data_flush


def test_it_names_the_active_segment_and_counts_what_was_appended_before_it(tmp_path: Path) -> None:
    log = _flushed_log(tmp_path)
    data_flush = _pending_flush(log)
    assert os.fstat(data_flush.fd).st_ino == segment_files(tmp_path)[-1].stat().st_ino
    append(log, make_batch(1))  # 5, after the flush began: not covered by it
    assert log.flushed_offset == 2
    os.fdatasync(data_flush.fd)
    data_flush.finish(True)
    assert log.flushed_offset == 5
    log.close()


def test_a_failed_sync_counts_nothing_and_the_next_flush_covers_it(tmp_path: Path) -> None:
    log = _flushed_log(tmp_path)
    data_flush = _pending_flush(log)
    data_flush.finish(False)
    assert log.flushed_offset == 2
    again = log.begin_data_flush()
    assert again is not None
    again.finish(True)
    assert log.flushed_offset == 5
    log.close()


def test_flushes_that_need_more_than_one_fdatasync_are_left_to_flush(tmp_path: Path) -> None:
    fresh = _flushed_log(tmp_path / "fresh")
    assert fresh.begin_data_flush() is None  # nothing to sync

    rolled = _flushed_log(tmp_path / "rolled", segment_bytes=1000)
    while len(segment_files(tmp_path / "rolled")) < 2:
        append(rolled, make_batch(2, value_size=100))
    assert rolled.begin_data_flush() is None  # the rolled segment's indexes, the new one's entry

    aborted = _flushed_log(tmp_path / "aborted")
    append(aborted, idempotent(7, 0, 0, count=2, attributes=TRANSACTIONAL))
    append(aborted, encode_control_batch(7, 0, False, 0, 1000))
    assert aborted.begin_data_flush() is None  # the transaction index
    assert aborted.flush() == aborted.log_end_offset
    for log in (fresh, rolled, aborted):
        log.close()


def test_a_truncation_during_the_sync_keeps_the_flushed_offset(tmp_path: Path) -> None:
    log = _flushed_log(tmp_path)
    data_flush = _pending_flush(log)
    log.truncate_to(3, now_ms=0)
    data_flush.finish(True)
    assert log.flushed_offset == 2
    log.close()


@pytest.mark.parametrize("synced", [True, False])
def test_a_segment_deleted_during_the_sync_is_closed_only_after_it(tmp_path: Path, synced: bool) -> None:
    log = _flushed_log(tmp_path, segment_bytes=1000, retention_bytes=1000, retention_ms=-1)
    append(log, make_batch(1))
    data_flush = log.begin_data_flush()
    assert data_flush is not None
    while len(segment_files(tmp_path)) < 3:
        append(log, make_batch(2, value_size=100))  # rolls past the segment being synced
    assert log.apply_retention(now_ms=0) > 0
    assert segment_files(tmp_path)[0].stem != "0" * 20
    assert os.fstat(data_flush.fd)  # deleted but still open
    data_flush.finish(synced)
    with pytest.raises(OSError):
        os.fstat(data_flush.fd)
    log.close()


def test_closing_the_log_does_not_wait_for_a_data_flush_and_leaves_its_file_open(tmp_path: Path) -> None:
    # The broker deletes a topic on its event loop, where the flush's `finish` also runs: a
    # close that waited for it would wait forever.
    log = _flushed_log(tmp_path)
    data_flush = _pending_flush(log)
    closing = threading.Thread(target=log.close, kwargs={"flush": False}, daemon=True)
    closing.start()
    closing.join(timeout=10)
    assert not closing.is_alive(), "close waited for a flush that only the closing thread can finish"
    assert os.fstat(data_flush.fd)  # the kernel may still be syncing it
    data_flush.finish(True)
    with pytest.raises(OSError):
        os.fstat(data_flush.fd)


def test_a_truncation_during_a_data_flush_leaves_what_is_written_again_unsynced(tmp_path: Path) -> None:
    # A leader turned follower cuts its log while its last flush is with the kernel, then
    # copies the new leader's batches over the cut bytes: that flush's end says nothing of them.
    log = _flushed_log(tmp_path)
    data_flush = _pending_flush(log)
    log.truncate_to(2, now_ms=0)
    append(log, make_batch(1))  # offset 2 again, written over the cut bytes
    os.fdatasync(data_flush.fd)
    data_flush.finish(True)
    assert log.flushed_offset == 2
    assert log.begin_data_flush() is not None  # still to sync, so a flush will sync it
    log.close()


def test_a_truncation_during_a_thread_flush_leaves_what_is_written_again_unsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _flushed_log(tmp_path)
    append(log, make_batch(3))
    real_fdatasync = os.fdatasync

    def truncate_and_write_again_meanwhile(fd: int) -> None:
        real_fdatasync(fd)
        monkeypatch.setattr(os, "fdatasync", real_fdatasync)
        log.truncate_to(2, now_ms=0)
        append(log, make_batch(1))

    monkeypatch.setattr(os, "fdatasync", truncate_and_write_again_meanwhile)
    assert log.flush() == 2
    assert log.begin_data_flush() is not None
    log.close()


def test_a_truncation_while_a_thread_flush_runs_voids_what_that_flush_would_record(tmp_path: Path) -> None:
    # A follower's truncation and the appends after it run on the event loop while a flush
    # thread is between reading the segment's size and its fdatasync (here: during the
    # transaction index's fsync, which comes first). The bytes appended then may be written
    # after the fdatasync began, so that sync must not count them.
    log = _flushed_log(tmp_path)  # offsets 0-1, synced
    append(log, make_batch(3))  # 2-4
    segment = log.segments[-1]
    sync_transaction_index = segment.txn_index.sync

    def truncate_and_append_meanwhile() -> None:
        sync_transaction_index()
        log.truncate_to(2, 0)
        append(log, make_batch(3))  # 2-4 again, as long as before

    segment.txn_index.sync = truncate_and_append_meanwhile  # type: ignore[method-assign]
    log.flush()
    assert segment.needs_sync(with_indexes=False), "bytes appended during the flush counted as synced"
    assert log.flushed_offset == 2
    log.close()
