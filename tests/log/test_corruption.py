"""A corrupt byte costs the batch it is in, never the data around it: recovery cuts only what a
crash may have torn (Kafka's rules), keeps and reports the rest, and reads answer CORRUPT_MESSAGE
where nothing can be read."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from onceflow.log.check import SegmentsChecked, check_data_dir
from onceflow.log.errors import LogReadError
from onceflow.log.loader import Shutdown
from onceflow.log.log import PartitionLog
from tests.log.batches import make_batch
from tests.log.helpers import append, open_log, segment_files
from tests.log.test_recovery import batch_positions, flip_byte, payload_byte_of

SEGMENT = {"segment_bytes": 400, "index_interval_bytes": 50}
MAGIC_AT = 16  # base offset 8, length 4, leader epoch 4


def _written(directory: Path, batches: int = 60) -> tuple[PartitionLog, int]:
    """A log of `batches` two-record batches over several segments, and its end."""
    log = open_log(directory, **SEGMENT)
    for _ in range(batches):
        append(log, make_batch(2, value_size=40))
    return log, log.log_end_offset


def _readable_offsets(log: PartitionLog) -> tuple[list[int], list[int]]:
    """Every offset a consumer can read, one fetch per offset, and those answered CORRUPT_MESSAGE."""
    readable, corrupt = [], []
    for offset in range(log.log_start_offset, log.log_end_offset):
        try:
            data = log.read(offset, 1)
        except LogReadError as error:
            assert error.error_code == ErrorCode.corrupt_message
            corrupt.append(offset)
            continue
        if data:
            readable.append(offset)
    return readable, corrupt


@pytest.mark.parametrize("shutdown", [Shutdown.CLEAN, Shutdown.CRASH, Shutdown.REBOOT])
def test_a_bad_magic_byte_below_the_recovery_point_costs_only_its_batch(
    tmp_path: Path, shutdown: Shutdown
) -> None:
    # The finding: a flipped magic byte in the last batch of the oldest segment, and a restart
    # that cut that segment there and deleted every later one (955 of 1,000 records).
    log, end = _written(tmp_path)
    log.close(flush=shutdown is Shutdown.CLEAN)
    oldest = segment_files(tmp_path)[0]
    position, base_offset, _ = batch_positions(oldest)[-1]
    flip_byte(oldest, position + MAGIC_AT)

    reopened = open_log(tmp_path, recovery_point=end, shutdown=shutdown, **SEGMENT)
    assert reopened.log_end_offset == end
    assert len(segment_files(tmp_path)) == len(reopened.segments)
    readable, corrupt = _readable_offsets(reopened)
    assert corrupt == [base_offset, base_offset + 1]
    assert readable == [offset for offset in range(end) if offset not in corrupt]
    assert [(found.first_offset, found.end_offset) for found in reopened.corrupt_ranges] == [
        (base_offset, base_offset + 2)
    ]


def test_after_a_process_crash_a_bad_batch_between_intact_ones_is_kept_and_a_torn_tail_cut(
    tmp_path: Path,
) -> None:
    log, end = _written(tmp_path)
    log.close(flush=False)
    segments = segment_files(tmp_path)
    middle = segments[len(segments) // 2]
    position, damaged_offset = payload_byte_of(middle, 1)
    flip_byte(middle, position)  # bit rot: the CRC fails, the header reads
    last = segments[-1]
    with last.open("r+b") as file:  # a write cut short at the very end
        file.truncate(last.stat().st_size - 5)

    # The page cache survived (same boot): nothing fsynced or written is torn, but the end.
    reopened = open_log(tmp_path, recovery_point=0, shutdown=Shutdown.CRASH, **SEGMENT)
    assert reopened.log_end_offset == end - 2  # the cut-short last batch only
    readable, corrupt = _readable_offsets(reopened)
    assert corrupt == [damaged_offset, damaged_offset + 1]
    assert len(readable) == end - 4


def test_after_a_reboot_a_bad_batch_past_the_recovery_point_is_cut_as_kafka_cuts(tmp_path: Path) -> None:
    log, _end = _written(tmp_path)
    log.close(flush=False)
    segments = segment_files(tmp_path)
    middle = segments[len(segments) // 2]
    position, damaged_offset = payload_byte_of(middle, 1)
    flip_byte(middle, position)

    reopened = open_log(tmp_path, recovery_point=0, shutdown=Shutdown.REBOOT, **SEGMENT)
    assert reopened.log_end_offset == damaged_offset
    assert not reopened.corrupt_ranges


def test_a_garbled_length_is_resynchronised_through_the_offset_index(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", index_interval_bytes=50)
    for _ in range(12):
        append(log, make_batch(2, value_size=40))
    end = log.log_end_offset
    log.close(flush=True)
    (segment,) = segment_files(tmp_path / "t-0")
    position, base_offset, _size = batch_positions(segment)[2]
    data = bytearray(segment.read_bytes())
    data[position + 8 : position + 12] = b"\x00\x10\x00\x00"  # its length: past the end of the file
    segment.write_bytes(data)
    # Where the broken batch ends is known only to the offset index.
    checked = SegmentsChecked()
    findings = list(check_data_dir(tmp_path, checked))
    assert [(finding.corrupt.position, finding.corrupt.end_offset) for finding in findings] == [
        (position, base_offset + 2)
    ]
    reopened = open_log(
        tmp_path / "t-0", recovery_point=end, shutdown=Shutdown.CLEAN, index_interval_bytes=50
    )
    readable, corrupt = _readable_offsets(reopened)
    assert corrupt == [base_offset, base_offset + 1]
    assert len(readable) == end - 2


def test_appends_after_a_corrupt_tail_start_at_the_durable_end(tmp_path: Path) -> None:
    log, end = _written(tmp_path)
    log.close(flush=True)
    last = segment_files(tmp_path)[-1]
    position, base_offset, _ = batch_positions(last)[-1]
    data = bytearray(last.read_bytes())
    data[position + 8 : position + 12] = b"\x00\x00\x00\x01"  # an impossible length, nothing after it
    last.write_bytes(data)

    reopened = open_log(tmp_path, recovery_point=end, shutdown=Shutdown.CLEAN, **SEGMENT)
    assert reopened.log_end_offset == end  # offsets handed out before are never handed out again
    assert append(reopened, make_batch(2, value_size=40)).base_offset == end
    readable, corrupt = _readable_offsets(reopened)
    assert corrupt == list(range(base_offset, end))
    assert readable[-2:] == [end, end + 1]
    assert [h.base_offset for h in _batches_from(reopened, base_offset - 2)] == [base_offset - 2, end]


def _batches_from(log: PartitionLog, offset: int) -> list[object]:
    from onceflow.log.batch import validate_batches

    headers = []
    while offset < log.log_end_offset:
        try:
            data = log.read(offset, 10_000)
        except LogReadError:
            offset += 1
            continue
        found = validate_batches(data)
        headers += found
        offset = found[-1].last_offset + 1
    return headers


def test_log_check_lists_every_corrupt_stretch_and_changes_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    log, _ = _written(data_dir / "t-0")
    log.close(flush=True)
    segments = segment_files(data_dir / "t-0")
    before = {path: path.read_bytes() for path in segments}
    for segment in (segments[0], segments[-1]):
        position, _ = payload_byte_of(segment, 0)
        flip_byte(segment, position)
    checked = SegmentsChecked()
    findings = list(check_data_dir(data_dir, checked))
    assert [(finding.topic, finding.partition, finding.segment) for finding in findings] == [
        ("t", 0, segments[0].name),
        ("t", 0, segments[-1].name),
    ]
    assert checked.segments == len(segments) and checked.partitions == 1
    assert sum(len(batch_positions(path)) for path in segments[1:-1]) < checked.batches
    assert [path.read_bytes() != before[path] for path in segments].count(True) == 2
