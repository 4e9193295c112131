from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from onceflow.log.batch import patch_base_offset, validate_batches
from onceflow.log.errors import LogAppendError, LogReadError, ProducerStateError, UnknownTopicError
from onceflow.log.files import write_fully_vectored
from onceflow.log.log import AppendResult
from onceflow.log.producer_state import list_snapshots
from tests.log.batches import idempotent, make_batch
from tests.log.helpers import append, open_log, read_all, segment_files


def test_a_read_does_not_cross_into_the_next_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=200)
    for _ in range(10):
        append(log, make_batch(2))
    first_segment_end = int(segment_files(tmp_path)[1].stem)
    assert validate_batches(log.read(0, 10**6))[-1].last_offset == first_segment_end - 1
    assert validate_batches(log.read(first_segment_end, 10**6))[0].base_offset == first_segment_end


def test_offsets_are_consecutive_and_batches_survive_segment_rolls(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=400, index_interval_bytes=60)
    rng = random.Random(1)
    sent = []
    for _ in range(120):
        batch = make_batch(rng.randint(1, 4), value_size=rng.randint(1, 60))
        result = append(log, batch)
        count = validate_batches(batch)[0].record_count
        assert result == AppendResult(log.log_end_offset - count, log.log_end_offset - 1)
        stored = bytearray(batch)  # the log writes the assigned offset, leaving `batch` as it is
        patch_base_offset(stored, 0, result.base_offset)
        sent.append(bytes(stored))

    assert len(segment_files(tmp_path)) > 10
    assert all(path.stat().st_size <= 400 for path in segment_files(tmp_path))
    received = log.read(0, 10**9)
    assert received.startswith(sent[0])
    assert b"".join(sent) == b"".join(log.read(h.base_offset, 1) for h in read_all(log))
    assert sum(len(index) for index in _index_lengths(tmp_path)) > 0

    # A read starting inside a batch returns that whole batch first.
    for header in read_all(log):
        for offset in range(header.base_offset, header.last_offset + 1):
            assert validate_batches(log.read(offset, 1))[0].base_offset == header.base_offset
    log.close()


def _index_lengths(directory: Path) -> list[bytes]:
    return [path.read_bytes() for path in segment_files(directory, ".index")]


def test_read_returns_at_least_one_whole_batch_and_respects_max_bytes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    sizes = []
    for value_size in (500, 20, 20, 20):
        batch = make_batch(1, value_size=value_size)
        sizes.append(len(batch))
        append(log, batch)
    assert len(log.read(0, 10)) == sizes[0]
    assert len(log.read(1, 10)) == sizes[1]
    assert len(log.read(1, sizes[1] + sizes[2] + sizes[3] - 1)) == sizes[1] + sizes[2]
    assert len(log.read(0, 10**6)) == sum(sizes)
    assert log.read(4, 100) == b""


def test_read_stops_before_max_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for _ in range(10):
        append(log, make_batch(2))
    assert [h.base_offset for h in validate_batches(log.read(0, 10**6, max_offset=5))] == [0, 2, 4]
    assert [h.base_offset for h in validate_batches(log.read(4, 10**6, max_offset=6))] == [4]
    assert log.read(6, 10**6, max_offset=6) == b""
    assert log.read(7, 10**6, max_offset=5) == b""


def test_reads_outside_the_log_are_offset_out_of_range(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=100, retention_bytes=0)
    for _ in range(5):
        append(log, make_batch())
    assert log.read(5, 100) == b""
    with pytest.raises(LogReadError) as caught:
        log.read(6, 100)
    assert caught.value.error_code == ErrorCode.offset_out_of_range
    log.apply_retention(now_ms=0)
    assert log.log_start_offset == 4
    with pytest.raises(LogReadError):
        log.read(3, 100)
    assert validate_batches(log.read(4, 100))[0].base_offset == 4


def test_offset_for_timestamp_finds_the_first_record_reaching_it(tmp_path: Path) -> None:
    """As Kafka: the first batch whose max timestamp reaches the target, then the first record in
    it that does."""
    log = open_log(tmp_path, segment_bytes=500, index_interval_bytes=100)
    rng = random.Random(7)
    for _ in range(80):
        timestamp = rng.randint(0, 10_000)
        append(log, make_batch(rng.randint(1, 3), timestamp=timestamp, value_size=30))
    headers = read_all(log)

    def expected(target: int) -> tuple[int, int] | None:
        for header in headers:
            if header.max_timestamp >= target:
                skipped = max(0, target - header.base_timestamp)  # record i is stamped base + i
                return header.base_offset + skipped, header.base_timestamp + skipped
        return None

    for target in [*range(-5, 10_100, 97), *(h.max_timestamp for h in headers)]:
        assert log.offset_for_timestamp(target) == expected(target), target
    newest = max(h.max_timestamp for h in headers)
    assert log.max_timestamp_offset() == expected(newest)


def test_timestamp_lookups_on_an_empty_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.offset_for_timestamp(0) is None
    assert log.max_timestamp_offset() is None


def test_retention_by_bytes_deletes_whole_oldest_segments_but_never_the_active_one(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300, retention_bytes=1000, retention_ms=-1)
    for _ in range(40):
        append(log, make_batch(1, value_size=50))
    before = log.size_bytes
    deleted = log.apply_retention(now_ms=10**12)
    assert deleted > 0
    # Kafka's rule: delete while the excess is at least the oldest segment's size.
    oldest = segment_files(tmp_path)[0].stat().st_size
    assert 0 <= log.size_bytes - 1000 < oldest
    assert before - log.size_bytes >= deleted * oldest
    assert (
        len(segment_files(tmp_path))
        == len(segment_files(tmp_path, ".index"))
        == len(segment_files(tmp_path, ".timeindex"))
    )
    assert int(segment_files(tmp_path)[0].stem) == log.log_start_offset
    assert read_all(log)[0].base_offset == log.log_start_offset
    assert read_all(log)[-1].last_offset == 39

    log.config = log.config.__class__(segment_bytes=300, retention_bytes=0, retention_ms=-1)
    log.apply_retention(now_ms=0)
    assert len(segment_files(tmp_path)) == 1
    assert log.log_start_offset == int(segment_files(tmp_path)[0].stem)
    append(log, make_batch())
    assert log.log_end_offset == 41


def test_retention_by_time_deletes_a_prefix_of_old_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300, retention_ms=1000)
    # Segment max timestamps: 100, 5000, 200, then the active segment.
    for timestamp in (100, 100, 5000, 5000, 200, 200, 100, 100):
        append(log, make_batch(1, timestamp=timestamp, value_size=60))
    assert len(segment_files(tmp_path)) == 4
    assert log.apply_retention(now_ms=1100) == 0  # 100 is exactly retention.ms old: kept
    assert log.apply_retention(now_ms=1101) == 1
    assert log.log_start_offset == 2
    # The segment stamped 200 is old, but it follows one that is not: kept, as in Kafka.
    assert log.apply_retention(now_ms=5500) == 0
    assert log.apply_retention(now_ms=100_000) == 2
    assert log.log_start_offset == 6


def test_retention_by_time_falls_back_to_file_age_for_batches_without_timestamps(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300, retention_ms=60_000)
    for _ in range(4):
        append(log, make_batch(1, timestamp=-1, max_timestamp=-1, value_size=60))
    now_ms = int(time.time() * 1000)
    assert log.apply_retention(now_ms) == 0
    first = segment_files(tmp_path)[0]
    os.utime(first, (now_ms / 1000 - 120, now_ms / 1000 - 120))
    assert log.apply_retention(now_ms) == 1
    assert not first.exists()


def test_append_refusals_write_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_message_bytes=200, segment_bytes=300)
    append(log, make_batch())
    size = segment_files(tmp_path)[0].stat().st_size

    def refused(batch: bytearray) -> ErrorCode:
        with pytest.raises(LogAppendError) as caught:
            append(log, batch)
        return caught.value.error_code

    assert refused(make_batch(1, value_size=300)) == ErrorCode.message_too_large
    assert refused(make_batch(1, value_size=100) + make_batch(1, value_size=100) + make_batch()) == (
        ErrorCode.record_list_too_large
    )
    assert refused(idempotent(1, 0, 0) + idempotent(1, 0, 1)) == ErrorCode.invalid_record
    assert refused(bytearray()) == ErrorCode.invalid_record
    assert log.log_end_offset == 1
    assert segment_files(tmp_path)[0].stat().st_size == size


def test_several_plain_batches_in_one_append(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    result = append(log, make_batch(2) + make_batch(3))
    assert (result.base_offset, result.last_offset) == (0, 4)
    assert [h.base_offset for h in read_all(log)] == [0, 2]


def test_duplicate_append_returns_the_original_offsets_and_writes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, make_batch(3))
    first = append(log, idempotent(5, 0, 0, count=2))
    append(log, idempotent(5, 0, 2))
    end, size = log.log_end_offset, log.size_bytes

    retry = append(log, idempotent(5, 0, 0, count=2))
    assert retry == AppendResult(3, 4, -1, duplicate=True)
    assert first == AppendResult(3, 4)
    assert (log.log_end_offset, log.size_bytes) == (end, size)

    with pytest.raises(ProducerStateError) as caught:
        append(log, idempotent(5, 0, 9))
    assert caught.value.error_code == ErrorCode.out_of_order_sequence_number
    assert (log.log_end_offset, log.size_bytes) == (end, size)


def test_a_roll_snapshots_producer_state_at_the_new_segment_base(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=150)
    for sequence in range(4):
        append(log, idempotent(5, 0, sequence, value_size=40))
    bases = [int(path.stem) for path in segment_files(tmp_path)]
    assert len(bases) > 1
    assert [int(path.stem) for path in list_snapshots(tmp_path)] == bases[1:][-3:]


def test_flush_runs_safely_beside_appends_rolls_and_retention(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=500, retention_bytes=3000, retention_ms=-1)
    stop = threading.Event()
    errors: list[BaseException] = []
    flushed: list[int] = []

    def flusher() -> None:
        try:
            while not stop.wait(0.0005):  # a busy loop would starve appends of the GIL
                flushed.append(log.flush())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for i in range(150):
            append(log, make_batch(2, value_size=50))
            if i % 20 == 0:
                log.apply_retention(now_ms=0)
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert flushed == sorted(flushed)
    assert log.flush() == log.log_end_offset == log.flushed_offset == 300
    log.close()
    assert log.flush() == 300


def test_append_writes_offsets_and_the_leader_epoch_without_touching_the_payload(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, make_batch(3))
    payload = bytes(make_batch(2))  # immutable, as kio decodes it
    log.append(payload, validate_batches(payload), 0, leader_epoch=9)
    assert payload == bytes(make_batch(2))
    stored = validate_batches(log.read(3, 10**6))
    assert [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in stored] == [(3, 4, 9)]


def test_a_vectored_write_of_more_pieces_than_iov_max_lands_in_order(tmp_path: Path) -> None:
    pieces: list[bytes | bytearray | memoryview] = [
        bytes([index % 251]) * (index % 3) for index in range(3 * os.sysconf("SC_IOV_MAX"))
    ]
    path = tmp_path / "pieces"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        write_fully_vectored(fd, pieces, 5)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\0" * 5 + b"".join(bytes(piece) for piece in pieces)


def test_a_followers_copy_is_taken_whatever_its_own_producer_state_says(tmp_path: Path) -> None:
    # The leader checked the sequences; a follower whose state differs (the leader expired the
    # producer at another moment, say) must store the batch, not refuse it and stop following.
    log = open_log(tmp_path)
    append(log, idempotent(7, 0, 0, count=5))
    gap = idempotent(7, 0, 10)
    with pytest.raises(ProducerStateError):
        append(log, gap)  # from a client: out of order
    copied = log.append(gap, validate_batches(gap), 0, replicated=True)
    assert (copied.base_offset, copied.duplicate) == (5, False)
    log.close()


def test_a_timestamp_lookup_starts_at_the_log_start(tmp_path: Path) -> None:
    # DeleteRecords left the start inside a batch: an offset below it would be out of range
    # for the consumer that asked, and its reset could skip what is left.
    log = open_log(tmp_path)
    for timestamp in (100, 200, 300):
        append(log, make_batch(3, timestamp=timestamp))  # offsets 0-8, each batch's records +1 ms
    log.delete_records_before(4)
    assert log.offset_for_timestamp(0) == (4, 201)
    assert log.offset_for_timestamp(200) == (4, 201)
    assert log.offset_for_timestamp(202) == (5, 202)
    log.close()


def test_close_waits_for_a_pinned_reader_and_a_closed_log_refuses_pins(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    append(log, make_batch(2))
    pinned, release = threading.Event(), threading.Event()
    read: list[int] = []

    def read_pinned() -> None:
        with log.segments_pinned():
            pinned.set()
            release.wait(10)
            read.extend(header.last_offset for header in read_all(log))

    reader = threading.Thread(target=read_pinned)
    reader.start()
    assert pinned.wait(10)
    closing = threading.Thread(target=log.close, kwargs={"flush": False})
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # close waits for the pin
    release.set()
    reader.join(10)
    closing.join(10)
    assert not closing.is_alive()
    assert read == [1]  # the files stayed open for the pinned reader
    with pytest.raises(UnknownTopicError), log.segments_pinned():
        pass
