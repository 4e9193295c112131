"""What Kafka's LogValidator checks in a client's batch before the leader appends it, and the
recompression a topic's `compression.type` asks for.

Followers and coordinators append without it: a follower copies what its leader validated (as
Kafka's `appendAsFollower`), a coordinator writes batches it built itself.

The work is bounded: at most `MAX_UNCOMPRESSED_BYTES` inflated and one pass over the records'
lengths, no key or value decoded. What may take longer than a moment (many records, a large
inflation, recompression) is `heavy`, and the broker runs it off the event loop.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from onceflow.log.batch import CRC_START, HEADER_SIZE, LOG_OVERHEAD, BatchHeader, parse_batch_header
from onceflow.log.config import LogConfig
from onceflow.log.errors import LogAppendError
from onceflow.records import (
    COMPILED,
    COMPRESSION_CODECS,
    MAX_UNCOMPRESSED_BYTES,
    CorruptCompressionError,
    RecordFormatError,
    compress,
    decompress,
    scan_records,
)

__all__ = ["RecordErrors", "ValidatedBatch", "is_heavy", "validate_client_batch"]

_COMPRESSION_MASK = 0x07
_CODEC_BY_NAME = {name: codec for codec, name in COMPRESSION_CODECS.items()}
# Below these the validation of a batch takes about a millisecond: it runs on the event loop.
LIGHT_RECORDS = 200_000 if COMPILED else 4096
LIGHT_INFLATED_BYTES = 1024 * 1024
_BATCH_LENGTH = struct.Struct(">i")
_ATTRIBUTES = struct.Struct(">h")
_CRC = struct.Struct(">I")
_ATTRIBUTES_AT = 21
_BATCH_LENGTH_AT = 8


class RecordErrors(LogAppendError):
    """INVALID_RECORD with the records at fault (Produce v8+'s `record_errors`): the client
    fails those with INVALID_RECORD and the others of the batch with a retriable error."""

    def __init__(self, message: str, record_errors: list[tuple[int, str]]) -> None:
        super().__init__(ErrorCode.invalid_record, message)
        self.record_errors = record_errors


@dataclass(frozen=True, slots=True)
class ValidatedBatch:
    records: bytes | bytearray | memoryview  # as the log stores it: recompressed when asked
    header: BatchHeader


def is_heavy(header: BatchHeader, config: LogConfig) -> bool:
    """Whether validating the batch may take more than about a millisecond of CPU."""
    return header.record_count > LIGHT_RECORDS or _target_codec(header, config) is not None


def validate_client_batch(
    records: bytes | bytearray | memoryview,
    header: BatchHeader,
    config: LogConfig,
    inflate_cap: int = MAX_UNCOMPRESSED_BYTES,
) -> ValidatedBatch:
    """Check one CRC-valid batch as Kafka's LogValidator does: offsets for exactly its records,
    every record well formed, a key on every record of a compacted topic, a sequence with every
    producer id; then recompress it to the topic's codec if that differs. Raises LogAppendError
    (INVALID_RECORD, CORRUPT_MESSAGE), RecordErrors, or `InflatesPastCap` when the records
    inflate past `inflate_cap` but not past the broker's cap (a light attempt: try it heavy)."""
    if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
        raise LogAppendError(
            ErrorCode.invalid_record,
            f"the batch declares {header.record_count} records but offsets for "
            f"{header.last_offset_delta + 1} (last offset delta {header.last_offset_delta})",
        )
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise LogAppendError(
            ErrorCode.invalid_record,
            f"producer {header.producer_id}'s batch has no sequence number ({header.base_sequence})",
        )
    codec = header.attributes & _COMPRESSION_MASK
    try:
        data: bytes | bytearray | memoryview = records
        start = HEADER_SIZE
        if codec:
            data, start = decompress(codec, records[HEADER_SIZE : header.size], inflate_cap), 0
        keyless: list[int] | None = [] if config.compact else None
        scan_records(data, start, header.record_count, keyless)
    except CorruptCompressionError as error:
        if inflate_cap < MAX_UNCOMPRESSED_BYTES and "inflate past" in str(error):
            raise InflatesPastCap(str(error)) from None
        raise LogAppendError(error.error_code, str(error)) from None
    except RecordFormatError as error:
        raise LogAppendError(error.error_code, f"invalid records in the batch: {error}") from None
    if keyless:
        message = "Compacted topic cannot accept message without key in topic partition."
        raise RecordErrors(message, [(index, message) for index in keyless])
    target = _target_codec(header, config)
    if target is None:
        return ValidatedBatch(records, header)
    uncompressed = bytes(data[start:])
    recompressed = _with_records(records, header, target, _compressed(target, uncompressed, config))
    return ValidatedBatch(recompressed, parse_batch_header(recompressed))


class InflatesPastCap(LogAppendError):
    """A light validation stopped at its small inflation cap; the heavy one may pass."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.corrupt_message, message)


def _target_codec(header: BatchHeader, config: LogConfig) -> int | None:
    """The codec to recompress to, or None to store the batch as it came."""
    wanted = config.compression_type
    if wanted == "producer":
        return None
    codec = _CODEC_BY_NAME[wanted]
    return None if codec == header.attributes & _COMPRESSION_MASK else codec


def _compressed(codec: int, data: bytes, config: LogConfig) -> bytes:
    if not codec:
        return data
    level = dict(config.compression_levels).get(COMPRESSION_CODECS[codec])
    return compress(codec, data, level)


def _with_records(
    records: bytes | bytearray | memoryview, header: BatchHeader, codec: int, body: bytes
) -> bytearray:
    """The batch with `body` as its records section, compressed with `codec`: its other header
    fields kept, length, attributes and CRC written anew."""
    batch = bytearray(records[:HEADER_SIZE])
    batch += body
    _BATCH_LENGTH.pack_into(batch, _BATCH_LENGTH_AT, len(batch) - LOG_OVERHEAD)
    _ATTRIBUTES.pack_into(batch, _ATTRIBUTES_AT, (header.attributes & ~_COMPRESSION_MASK) | codec)
    _CRC.pack_into(batch, CRC_START - _CRC.size, crc32c(memoryview(batch)[CRC_START:]))
    return batch
