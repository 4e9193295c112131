"""The produce validator (Kafka's LogValidator) on batches built by an independent encoder
(aiokafka's), and on batches that lie about their records."""

from __future__ import annotations

import struct
import time
import tracemalloc

import cramjam
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from onceflow.log.batch import decode_records, parse_batch_header, validate_batches
from onceflow.log.config import LogConfig
from onceflow.log.errors import LogAppendError
from onceflow.log.validator import InflatesPastCap, RecordErrors, validate_client_batch
from onceflow.records import COMPILED, MAX_UNCOMPRESSED_BYTES, RecordFormatError, scan_records, walk_records

PLAIN = LogConfig()
COMPACT = LogConfig(cleanup_policy="compact")
CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]

records_strategy = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=300),
        st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=20)), max_size=3),
    ),
    min_size=1,
    max_size=40,
)


def build(records: list[Record], codec: int = 0, producer_id: int = -1, base_sequence: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
        batch_size=1 << 24,
    )
    for offset, (key, value, headers) in enumerate(records):
        builder.append(offset, timestamp=1_700_000_000_000 + offset, key=key, value=value, headers=headers)
    return bytes(builder.build())


def validate(batch: bytes, config: LogConfig = PLAIN, cap: int = MAX_UNCOMPRESSED_BYTES) -> bytes:
    (header,) = validate_batches(batch)
    return bytes(validate_client_batch(batch, header, config, cap).records)


def with_records_section(batch: bytes, body: bytes, record_count: int | None = None) -> bytes:
    """The batch with another records section (and count), its length and CRC made right."""
    patched = bytearray(batch[:61]) + body
    struct.pack_into(">i", patched, 8, len(patched) - 12)
    if record_count is not None:
        struct.pack_into(">i", patched, 57, record_count)
        struct.pack_into(">i", patched, 23, record_count - 1)
    struct.pack_into(">I", patched, 17, crc32c(memoryview(patched)[21:]))
    return bytes(patched)


@settings(max_examples=60, deadline=None)
@given(records_strategy, st.sampled_from(sorted(CODECS.values())))
def test_every_batch_a_client_builds_is_accepted_as_it_came(records: list[Record], codec: int) -> None:
    batch = build(records, codec)
    assert validate(batch) == batch


@settings(max_examples=40, deadline=None)
@given(records_strategy, st.integers(min_value=1, max_value=5))
def test_a_batch_whose_header_lies_about_its_records_is_invalid(records: list[Record], lie: int) -> None:
    batch = build(records)
    for count in (len(records) + lie, len(records) - lie):
        if count > 0:
            lying = with_records_section(batch, batch[61:], count)
            with pytest.raises(LogAppendError) as refused:
                validate(lying)
            assert refused.value.error_code == ErrorCode.invalid_record


def test_records_cut_short_or_with_bytes_after_them_are_invalid() -> None:
    batch = build([(b"k", b"value", [])] * 3)
    for body in (batch[61:-2], batch[61:] + b"\x00\x00"):
        with pytest.raises(LogAppendError) as refused:
            validate(with_records_section(batch, body))
        assert refused.value.error_code == ErrorCode.invalid_record


def test_offset_deltas_must_count_up_from_zero() -> None:
    batch = build([(b"k", b"a", []), (b"k", b"b", [])])
    # Each record is 9 bytes: length, attributes, timestamp delta, offset delta, key length,
    # key, value length, value, header count.
    body = bytearray(batch[61:])
    assert body[9 + 3] == 2  # the second record's offset delta, 1 as a zigzag varint
    body[9 + 3] = 0  # 0 again: both records would have one offset
    with pytest.raises(LogAppendError, match="offset delta"):
        validate(with_records_section(batch, bytes(body)))


def test_a_varint_longer_than_five_bytes_is_refused_at_once() -> None:
    # Kafka's ByteUtils refuse it; a reader without the limit is quadratic in its length.
    batch = build([(b"k", b"v", [])])
    started = time.perf_counter()
    for body in (b"\xff" * 300_000, b"\x0c\x00" + b"\xff" * 20 + b"\x00"):
        with pytest.raises(LogAppendError) as refused:
            validate(with_records_section(batch, body, 1))
        assert refused.value.error_code == ErrorCode.invalid_record
    assert time.perf_counter() - started < 1


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_a_compression_bomb_stops_at_the_cap(codec: str) -> None:
    module = getattr(cramjam, codec)
    zeros = b"\x00" * (MAX_UNCOMPRESSED_BYTES + 1024 * 1024)
    bomb = bytes(module.compress_raw(zeros) if codec == "snappy" else module.compress(zeros))
    batch = build([(b"k", b"v", [])], CODECS[codec])
    batch = with_records_section(batch, bomb)
    tracemalloc.start()
    try:
        with pytest.raises(LogAppendError) as refused:
            validate(batch)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.error_code == ErrorCode.corrupt_message
    assert peak < 3 * MAX_UNCOMPRESSED_BYTES  # about one cap of output, not the bomb's size
    with pytest.raises(InflatesPastCap):  # a light attempt on the event loop stops far sooner
        validate(batch, cap=1024 * 1024)


def test_garbage_that_does_not_inflate_is_corrupt_message() -> None:
    batch = with_records_section(build([(b"k", b"v", [])], CODECS["zstd"]), b"not zstd at all")
    with pytest.raises(LogAppendError) as refused:
        validate(batch)
    assert refused.value.error_code == ErrorCode.corrupt_message


def test_a_compacted_topic_lists_the_records_without_a_key() -> None:
    records: list[Record] = [(None if index % 10 == 3 else b"k%d" % index, b"v", []) for index in range(100)]
    batch = build(records)
    with pytest.raises(RecordErrors) as refused:
        validate(batch, COMPACT)
    assert refused.value.error_code == ErrorCode.invalid_record
    assert [index for index, _ in refused.value.record_errors] == list(range(3, 100, 10))
    assert validate(batch) == batch  # a plain topic takes records without keys


@pytest.mark.parametrize("target", ["gzip", "snappy", "lz4", "zstd", "uncompressed"])
def test_a_topic_codec_recompresses_and_keeps_every_record(target: str) -> None:
    records: list[Record] = [(b"k%d" % index, b"value %d" % index * 5, [("h", b"x")]) for index in range(50)]
    batch = build(records, CODECS["lz4"] if target == "uncompressed" else 0, producer_id=7, base_sequence=3)
    stored = validate(batch, LogConfig(compression_type=target))
    header, original = parse_batch_header(stored), parse_batch_header(batch)
    assert header.attributes & 7 == CODECS[target]
    kept = ("producer_id", "producer_epoch", "base_sequence", "record_count", "last_offset_delta")
    assert all(getattr(header, name) == getattr(original, name) for name in kept)
    assert decode_records(stored) == decode_records(batch)
    assert validate_batches(stored)  # its CRC is right


def test_a_producer_id_without_a_sequence_is_invalid() -> None:
    with pytest.raises(LogAppendError, match="no sequence"):
        validate(build([(b"k", b"v", [])], producer_id=5, base_sequence=-1))


def _judged(walk: object, batch: bytes, count: int, produced: bool) -> list[int] | None:
    """What a walk makes of the records: the keyless ones, or None when it refuses them."""
    keyless: list[int] = []
    try:
        walk(batch, 61, count, keyless, None, produced)  # type: ignore[operator]
    except RecordFormatError:
        return None
    return keyless


@settings(max_examples=200, deadline=None)
@given(records_strategy, st.data())
def test_the_compiled_walk_judges_every_batch_as_the_python_walk(
    records: list[Record], data: st.DataObject
) -> None:
    assert COMPILED, "onceflow._recordscan was not built (make setup compiles it)"
    batch = build(records)
    count = data.draw(st.sampled_from([len(records), len(records) + 1, max(len(records) - 1, 0)]))
    produced = data.draw(st.booleans())
    assert _judged(walk_records, batch, count, produced) == _judged(scan_records, batch, count, produced)


def test_the_compiled_walk_judges_every_damaged_byte_as_the_python_walk() -> None:
    # Every byte of the records section replaced by each of a few telling values: lengths,
    # deltas and counts that lie, varints that go on, headers that appear from nowhere.
    records: list[Record] = [(None, b"v" * 70, []), (b"key", None, [("h", b"x")]), (b"k", b"", [])]
    original = build(records)
    differing, refused = [], 0
    for position in range(61, len(original)):
        for value in (0, 1, 2, 3, 0x7F, 0x80, 0xFF):
            batch = bytearray(original)
            batch[position] = value
            for produced in (True, False):
                python = _judged(walk_records, bytes(batch), len(records), produced)
                refused += python is None
                if python != _judged(scan_records, bytes(batch), len(records), produced):
                    differing.append((position, value, produced))
    assert refused > 100 and not differing, differing
