"""Kafka RecordBatch v2 headers: parsing, validation and offset patching.

The broker never decompresses or re-encodes batches. It reads the fixed 61-byte header,
checks the CRC32C and rewrites the base offset in place (the CRC does not cover it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from onceflow.records import RecordFields, RecordFormatError, decompress, scan_records

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")

HEADER_SIZE = _HEADER.size  # 61
# baseOffset and batchLength are not counted in batchLength.
LOG_OVERHEAD = 12
# The CRC covers everything from the attributes field to the end of the batch.
CRC_START = 21
MAGIC = 2
MAX_SEQUENCE = 2**31 - 1

_TRANSACTIONAL_FLAG = 0x10
_COMPRESSION_MASK = 0x07
_CONTROL_FLAG = 0x20


class CorruptRecordError(ValueError):
    """A batch is truncated, has a bad magic byte or length, or fails its CRC."""

    error_code = ErrorCode.corrupt_message


def next_sequence(sequence: int, increment: int = 1) -> int:
    """Producer sequences are non-negative int32 values that wrap from 2**31-1 to 0."""
    return (sequence + increment) & MAX_SEQUENCE


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return next_sequence(self.base_sequence, self.last_offset_delta)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


def parse_batch_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at `pos` without checking the CRC."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch header at byte {pos}: {len(buf) - pos} of {HEADER_SIZE} bytes"
        )
    header = BatchHeader(*_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise CorruptRecordError(
            f"unsupported record batch magic {header.magic} at byte {pos} (only v2 is supported)"
        )
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(f"batch length {header.batch_length} at byte {pos} is too small")
    if header.last_offset_delta < 0:
        raise CorruptRecordError(f"negative last offset delta {header.last_offset_delta} at byte {pos}")
    return header


def batch_crc_matches(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bool:
    """Whether the stored CRC matches the batch bytes; the batch must lie wholly in `buf`."""
    view = memoryview(buf)[pos + CRC_START : pos + header.size]
    return crc32c(view) == header.crc


def validate_batches(records: bytes | bytearray | memoryview) -> list[BatchHeader]:
    """Split a produce payload into batches whose lengths exactly cover it and whose CRCs match."""
    headers: list[BatchHeader] = []
    pos = 0
    end = len(records)
    while pos < end:
        header = parse_batch_header(records, pos)
        if pos + header.size > end:
            raise CorruptRecordError(
                f"batch at byte {pos} claims {header.size} bytes but only {end - pos} remain"
            )
        if not batch_crc_matches(records, pos, header):
            raise CorruptRecordError(f"CRC mismatch in the batch at byte {pos}")
        headers.append(header)
        pos += header.size
    return headers


def next_offset_after(records: bytes | bytearray | memoryview) -> int:
    """The offset after the last batch of well-formed `records` (headers only, no CRC)."""
    position = 0
    header = None
    while position < len(records):
        header = parse_batch_header(records, position)
        position += header.size
    if header is None:
        raise CorruptRecordError("no batch")
    return header.last_offset + 1


def patch_base_offset(buf: bytearray, pos: int, base_offset: int) -> None:
    """Assign the batch's base offset in place; the CRC does not cover it."""
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


# The fields before the magic byte, outside the CRC: base offset, batch length, leader epoch.
_STORED_PREFIX = struct.Struct(">qii")
STORED_PREFIX_SIZE = _STORED_PREFIX.size


def stored_prefix(header: BatchHeader, base_offset: int, leader_epoch: int | None) -> bytes:
    """The batch's first bytes as the log stores them: with its assigned base offset and, when
    given, the leader's epoch. Written ahead of the rest of the batch as received, so that the
    payload is never copied to patch it."""
    epoch = header.partition_leader_epoch if leader_epoch is None else leader_epoch
    return _STORED_PREFIX.pack(base_offset, header.batch_length, epoch)


def patch_partition_leader_epoch(buf: bytearray, pos: int, leader_epoch: int) -> None:
    """Stamp the leader's epoch on the batch in place (its 4 bytes follow the batch length);
    the CRC does not cover it either."""
    _LEADER_EPOCH.pack_into(buf, pos + LOG_OVERHEAD, leader_epoch)


# -- record-level reads (ListOffsets by timestamp, the cleaner, the coordinators' replay) --------


def first_record_at_or_after(batch: bytes, timestamp_ms: int, min_offset: int = 0) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record in `batch` at or after `min_offset` whose
    timestamp is at least `timestamp_ms` (Kafka answers ListOffsets by timestamp per record,
    not per batch)."""
    header = parse_batch_header(batch)
    if header.attributes & 0x08:  # LogAppendTime: every record has the batch's max timestamp
        first = max(header.base_offset, min_offset)
        return (first, header.max_timestamp) if header.max_timestamp >= timestamp_ms else None
    return next(
        (
            (record.offset, record.timestamp)
            for record in decode_records(batch)
            if record.timestamp >= timestamp_ms and record.offset >= min_offset
        ),
        None,
    )


# -- building and decoding batches the broker writes itself (markers, coordinator logs) --------


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


_CONTROL_KEY = struct.Struct(">hh")  # version 0, type: 0 = ABORT, 1 = COMMIT
_CONTROL_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _bytes_field(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


def encode_batch(
    records: list[tuple[bytes | None, bytes | None]],
    timestamp_ms: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> bytearray:
    """An uncompressed v2 batch at base offset 0 (append() assigns the real one)."""
    body = bytearray()
    for index, (key, value) in enumerate(records):
        record = b"\x00" + _varint(0) + _varint(index) + _bytes_field(key) + _bytes_field(value) + _varint(0)
        body += _varint(len(record)) + record
    attributes = (_TRANSACTIONAL_FLAG if transactional else 0) | (_CONTROL_FLAG if control else 0)
    count = len(records)
    batch = bytearray(
        _HEADER.pack(
            0,
            HEADER_SIZE - LOG_OVERHEAD + len(body),
            0,
            MAGIC,
            0,
            attributes,
            count - 1,
            timestamp_ms,
            timestamp_ms,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    )
    batch += body
    struct.pack_into(">I", batch, CRC_START - 4, crc32c(memoryview(batch)[CRC_START:]))
    return batch


def encode_control_batch(
    producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int
) -> bytearray:
    """A COMMIT or ABORT transaction marker: one control record, one offset."""
    key = _CONTROL_KEY.pack(0, 1 if commit else 0)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return encode_batch(
        [(key, value)], timestamp_ms, producer_id, producer_epoch, transactional=True, control=True
    )


def control_batch_is_commit(batch: bytes) -> bool:
    """Whether a control batch is a COMMIT marker (else ABORT)."""
    (record,) = decode_records(batch)
    assert record.key is not None
    control_type: int = _CONTROL_KEY.unpack(record.key)[1]
    return control_type == 1


def control_batch_coordinator_epoch(batch: bytes | bytearray | memoryview) -> int:
    """The epoch of the transaction coordinator that wrote a COMMIT or ABORT marker (-1 when
    the marker carries no readable one)."""
    (record,) = decode_records(bytes(batch))
    if record.value is None or len(record.value) < _CONTROL_VALUE.size:
        return -1
    coordinator_epoch: int = _CONTROL_VALUE.unpack_from(record.value)[1]
    return coordinator_epoch


def decode_records(batch: bytes | bytearray | memoryview) -> list[Record]:
    """Every record of one batch, decompressed when needed."""
    return [record for record, _ in decode_records_with_bytes(batch)]


def decode_records_with_bytes(batch: bytes | bytearray | memoryview) -> list[tuple[Record, bytes]]:
    """Every record of one batch with its encoded bytes (length prefix included), which stay
    valid in any batch with the same base offset and base timestamp. Bounded as a produced
    batch's validation is (`onceflow.records`); CorruptRecordError when the records are bad."""
    header = parse_batch_header(batch)
    fields: list[RecordFields] = []
    codec = header.attributes & _COMPRESSION_MASK
    data: bytes | memoryview = memoryview(batch)[: header.size]
    try:
        if codec:
            data = decompress(codec, data[HEADER_SIZE:])
        scan_records(data, 0 if codec else HEADER_SIZE, header.record_count, fields=fields, produced=False)
    except RecordFormatError as error:
        raise CorruptRecordError(
            f"cannot read the records of the batch at {header.base_offset}: {error}"
        ) from error
    return [
        (
            Record(
                header.base_offset + field.offset_delta,
                header.base_timestamp + field.timestamp_delta,
                field.key(data),
                field.value(data),
            ),
            bytes(data[field.start : field.end]),
        )
        for field in fields
    ]


def rebuild_batch(header: BatchHeader, encoded_records: list[bytes]) -> bytearray:
    """`header`'s batch holding only `encoded_records`, uncompressed, with the same base and
    last offset (so producer sequences still line up), timestamps and producer fields. The
    log cleaner writes these; an empty one keeps a producer's last sequence (Kafka's
    RETAIN_EMPTY)."""
    body = b"".join(encoded_records)
    batch = bytearray(
        _HEADER.pack(
            header.base_offset,
            HEADER_SIZE - LOG_OVERHEAD + len(body),
            header.partition_leader_epoch,
            MAGIC,
            0,
            header.attributes & ~_COMPRESSION_MASK,
            header.last_offset_delta,
            header.base_timestamp,
            header.max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            len(encoded_records),
        )
    )
    batch += body
    struct.pack_into(">I", batch, CRC_START - 4, crc32c(memoryview(batch)[CRC_START:]))
    return batch
