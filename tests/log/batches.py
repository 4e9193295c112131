"""Builds Kafka v2 record batches byte by byte, so tests control every header field."""

from __future__ import annotations

import struct

from crc32c import crc32c

TRANSACTIONAL = 0x10

_BEFORE_CRC = struct.Struct(">qiibI")
_AFTER_CRC = struct.Struct(">hiqqqhii")


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _record(offset_delta: int, timestamp_delta: int, value: bytes) -> bytes:
    body = b"\x00" + _varint(timestamp_delta) + _varint(offset_delta) + _varint(-1)
    body += _varint(len(value)) + value + _varint(0)
    return _varint(len(body)) + body


def make_batch(
    count: int = 1,
    *,
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    timestamp: int = 1_000_000,
    max_timestamp: int | None = None,
    value_size: int = 10,
    attributes: int = 0,
    base_offset: int = 0,
) -> bytearray:
    """A batch of `count` records, record i stamped `timestamp + i` unless `max_timestamp`
    overrides the header's max timestamp."""
    records = b"".join(_record(i, i, bytes([65 + i % 26]) * value_size) for i in range(count))
    max_ts = timestamp + count - 1 if max_timestamp is None else max_timestamp
    after = (
        _AFTER_CRC.pack(attributes, count - 1, timestamp, max_ts, producer_id, epoch, base_sequence, count)
        + records
    )
    before = _BEFORE_CRC.pack(base_offset, len(after) + 9, 0, 2, crc32c(after))
    return bytearray(before + after)


def idempotent(producer_id: int, epoch: int, base_sequence: int, count: int = 1, **kwargs: int) -> bytearray:
    return make_batch(count, producer_id=producer_id, epoch=epoch, base_sequence=base_sequence, **kwargs)
