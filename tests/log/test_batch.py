from __future__ import annotations

import datetime
import io
import struct
from collections.abc import Callable

import cramjam
import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from onceflow.log.batch import (
    HEADER_SIZE,
    CorruptRecordError,
    control_batch_is_commit,
    decode_records,
    encode_batch,
    encode_control_batch,
    first_record_at_or_after,
    next_offset_after,
    parse_batch_header,
    patch_base_offset,
    validate_batches,
)
from tests.log.batches import TRANSACTIONAL, make_batch


@given(
    count=st.integers(1, 20),
    producer_id=st.integers(-1, 2**63 - 1),
    epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
    timestamp=st.integers(0, 2**50),
    attributes=st.sampled_from([0, TRANSACTIONAL, 0x20, 0x08]),
    new_base=st.integers(0, 2**62),
)
def test_header_parse_and_offset_patch_round_trip(
    count: int,
    producer_id: int,
    epoch: int,
    base_sequence: int,
    timestamp: int,
    attributes: int,
    new_base: int,
) -> None:
    batch = make_batch(
        count,
        producer_id=producer_id,
        epoch=epoch,
        base_sequence=base_sequence,
        timestamp=timestamp,
        attributes=attributes,
    )
    (header,) = validate_batches(batch)
    assert header.size == len(batch)
    assert header.last_offset_delta == count - 1
    assert header.record_count == count
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        producer_id,
        epoch,
        base_sequence,
    )
    assert header.max_timestamp == timestamp + count - 1
    assert header.is_transactional == bool(attributes & TRANSACTIONAL)
    assert header.is_control == bool(attributes & 0x20)
    assert header.has_producer_id == (producer_id >= 0)

    patch_base_offset(batch, 0, new_base)
    (patched,) = validate_batches(batch)  # the CRC does not cover the base offset
    assert patched.base_offset == new_base
    assert patched.last_offset == new_base + count - 1


@given(count=st.integers(1, 5), new_base=st.integers(0, 2**40))
def test_kio_reads_patched_batches(count: int, new_base: int) -> None:
    batch = make_batch(count, timestamp=1_700_000_000_000)
    patch_base_offset(batch, 0, new_base)
    parsed, size = read_batch(bytes(batch), 0)
    assert size == len(batch)
    assert [record.offset for record in parsed.records] == list(range(new_base, new_base + count))


def test_parses_batches_written_by_kio() -> None:
    records = tuple(
        Record(
            attributes=i8(0),
            timestamp=TZAwareMicros.parse(datetime.datetime.fromtimestamp(1000 + i, tz=datetime.UTC)),
            offset=i64(i),
            key=None,
            value=b"v%d" % i,
            headers=(),
        )
        for i in range(3)
    )
    buffer = io.BytesIO()
    write_new_batch(
        buffer,
        NewRecordBatch(
            producer_id=i64(7),
            producer_epoch=i16(2),
            base_sequence=i32(40),
            records=records,
            attributes=i16(0),
        ),
    )
    (header,) = validate_batches(buffer.getvalue())
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 40)
    assert header.last_sequence == 42
    assert header.max_timestamp == 1_002_000


def test_several_batches_are_split_in_order() -> None:
    payload = make_batch(2) + make_batch(1, value_size=100) + make_batch(5)
    headers = validate_batches(payload)
    assert [header.record_count for header in headers] == [2, 1, 5]
    assert sum(header.size for header in headers) == len(payload)


@given(data=st.data())
def test_any_flipped_byte_after_the_crc_field_is_detected(data: st.DataObject) -> None:
    batch = make_batch(3)
    position = data.draw(st.integers(21, len(batch) - 1))
    batch[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecordError):
        validate_batches(batch)


@given(data=st.data())
def test_any_truncation_is_detected(data: st.DataObject) -> None:
    batch = make_batch(3) + make_batch(2)
    cut = data.draw(st.integers(1, len(batch) - 1).filter(lambda n: n != len(make_batch(3))))
    with pytest.raises(CorruptRecordError):
        validate_batches(batch[:cut])


def test_bad_magic_and_length_are_rejected_with_a_readable_message() -> None:
    batch = make_batch()
    batch[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1"):
        parse_batch_header(batch)
    short = make_batch()
    short[8:12] = (10).to_bytes(4, "big")
    with pytest.raises(CorruptRecordError, match="too small"):
        parse_batch_header(short)
    with pytest.raises(CorruptRecordError, match="truncated"):
        parse_batch_header(make_batch()[: HEADER_SIZE - 1])


def test_empty_payload_holds_no_batches() -> None:
    assert validate_batches(b"") == []


@pytest.mark.parametrize(
    ("base_sequence", "count", "last_sequence"),
    [(0, 1, 0), (5, 3, 7), (2**31 - 1, 1, 2**31 - 1), (2**31 - 1, 2, 0), (2**31 - 2, 5, 2), (-1, 4, -1)],
)
def test_last_sequence_wraps_past_int32_max(base_sequence: int, count: int, last_sequence: int) -> None:
    (header,) = validate_batches(make_batch(count, producer_id=1, epoch=0, base_sequence=base_sequence))
    assert header.last_sequence == last_sequence


def _compressed_batch(codec: int, compress: Callable[[bytes], bytes], timestamps: list[int]) -> bytes:
    from tests.log.batches import _AFTER_CRC, _BEFORE_CRC, _record

    base = timestamps[0]
    records = b"".join(_record(i, ts - base, b"v" * 20) for i, ts in enumerate(timestamps))
    count = len(timestamps)
    after = _AFTER_CRC.pack(codec, count - 1, base, max(timestamps), -1, -1, -1, count) + compress(records)
    return _BEFORE_CRC.pack(100, len(after) + 9, 0, 2, crc32c(after)) + after


def _xerial(data: bytes) -> bytes:
    block = bytes(cramjam.snappy.compress_raw(data))
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block


@pytest.mark.parametrize(
    "codec, compress",
    [
        (0, lambda data: data),
        (1, lambda data: bytes(cramjam.gzip.compress(data))),
        (2, lambda data: bytes(cramjam.snappy.compress_raw(data))),
        (2, _xerial),
        (3, lambda data: bytes(cramjam.lz4.compress(data))),
        (4, lambda data: bytes(cramjam.zstd.compress(data))),
    ],
)
def test_first_record_at_or_after_reads_every_codec(codec: int, compress: Callable[[bytes], bytes]) -> None:
    timestamps = [1000, 1000, 1005, 1003, 1010]
    batch = _compressed_batch(codec, compress, timestamps)
    assert first_record_at_or_after(batch, 0) == (100, 1000)
    assert first_record_at_or_after(batch, 1001) == (102, 1005)
    assert first_record_at_or_after(batch, 1010) == (104, 1010)
    assert first_record_at_or_after(batch, 1011) is None


def test_first_record_at_or_after_reports_garbage_as_corrupt() -> None:
    batch = _compressed_batch(1, lambda data: b"not gzip at all", [1, 2])
    with pytest.raises(CorruptRecordError):
        first_record_at_or_after(batch, 0)


@given(
    st.lists(
        st.tuples(st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=200)),
        min_size=1,
        max_size=20,
    ),
    st.integers(0, 2**40),
    st.booleans(),
)
def test_encoded_batches_read_back_with_kio(
    records: list[tuple[bytes | None, bytes | None]], timestamp: int, transactional: bool
) -> None:
    batch = encode_batch(
        records, timestamp, producer_id=5, producer_epoch=1, base_sequence=9, transactional=transactional
    )
    assert validate_batches(batch)[0].is_transactional == transactional
    parsed, size = read_batch(bytes(batch), 0)  # kio checks the CRC itself
    assert size == len(batch)
    assert [(r.key, r.value) for r in parsed.records] == records
    assert [(r.key, r.value) for r in decode_records(batch)] == records
    assert {r.timestamp for r in decode_records(batch)} == {timestamp}


@pytest.mark.parametrize("commit", [True, False])
def test_control_batches(commit: bool) -> None:
    batch = encode_control_batch(7, 3, commit, coordinator_epoch=2, timestamp_ms=1000)
    header = validate_batches(batch)[0]
    assert header.is_control and header.is_transactional and header.record_count == 1
    assert (header.producer_id, header.producer_epoch) == (7, 3)
    assert control_batch_is_commit(batch) == commit


def test_next_offset_after_walks_the_headers() -> None:
    first = make_batch(3)
    second = make_batch(2)
    patch_base_offset(second, 0, 3)
    assert next_offset_after(first + second) == 5
    with pytest.raises(CorruptRecordError):
        next_offset_after(b"")
