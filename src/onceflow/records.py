"""The records inside a Kafka v2 record batch, read within bounds.

Kafka's `DefaultRecord` layout, with the limits of its `ByteUtils`: varints of at most 5 bytes
and varlongs of at most 10, each record exactly as long as its length prefix says, exactly as
many records as the batch header declares, and nothing after them. Decompression stops at a cap,
so a small batch cannot inflate into gigabytes. Pure functions on bytes: the broker's validator,
the log cleaner, ListOffsets and the fault proxy all read records through here.
"""

from __future__ import annotations

import importlib
import struct
import zlib
from dataclasses import dataclass
from types import ModuleType

import cramjam
from kio._kio_native import read_signed_varint, read_signed_varlong
from kio.schema.errors import ErrorCode
from kio.serial.errors import DecodeError

try:
    # By name: an import statement would import the onceflow package too, and with it the broker.
    _compiled: ModuleType | None = importlib.import_module("onceflow._recordscan")
except ImportError:  # built without a C compiler: the same walk, in Python
    _compiled = None
# Whether the produce validator's walk is the compiled one (a few nanoseconds a record).
COMPILED = _compiled is not None

__all__ = [
    "COMPILED",
    "COMPRESSION_CODECS",
    "MAX_UNCOMPRESSED_BYTES",
    "RecordFields",
    "RecordFormatError",
    "compress",
    "decompress",
    "scan_records",
    "walk_records",
]

# What one batch may inflate to. Kafka sets no such bound, but the JVM streams what it reads;
# a batch that producers fill to max.message.bytes (1 MB) compressed stays far below it.
MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024
COMPRESSION_CODECS = {0: "uncompressed", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
# attributes, timestamp delta, offset delta, key length, value length, header count: a byte each
_MIN_RECORD_BODY = 6
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
_XERIAL_BLOCK_LENGTH = struct.Struct(">i")
_FIRST_GROWTH = 256 * 1024


class RecordFormatError(ValueError):
    """The records do not match their batch: Kafka's InvalidRecordException (INVALID_RECORD)."""

    error_code = ErrorCode.invalid_record


class CorruptCompressionError(RecordFormatError):
    """The compressed records cannot be inflated, or inflate past the cap (CORRUPT_MESSAGE)."""

    error_code = ErrorCode.corrupt_message


@dataclass(frozen=True, slots=True)
class RecordFields:
    """Where one record's parts lie in the records section (positions, not copies)."""

    start: int  # its length prefix
    end: int
    timestamp_delta: int
    offset_delta: int
    key_at: int
    key_length: int  # -1: no key
    value_at: int
    value_length: int  # -1: a tombstone

    def key(self, data: bytes | bytearray | memoryview) -> bytes | None:
        return None if self.key_length < 0 else bytes(data[self.key_at : self.key_at + self.key_length])

    def value(self, data: bytes | bytearray | memoryview) -> bytes | None:
        if self.value_length < 0:
            return None
        return bytes(data[self.value_at : self.value_at + self.value_length])


def _varint(data: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """A zigzag varint of at most 5 bytes that fits an int32, and the position after it."""
    try:
        value, size = read_signed_varint(data, position)
    except (ValueError, DecodeError) as error:
        raise RecordFormatError(f"bad varint at byte {position}: {error}") from None
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise RecordFormatError(f"varint at byte {position} overflows an int32")
    return value, position + size


def _varlong(data: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """A zigzag varlong of at most 10 bytes, and the position after it."""
    try:
        value, size = read_signed_varlong(data, position)
    except (ValueError, DecodeError) as error:
        raise RecordFormatError(f"bad varlong at byte {position}: {error}") from None
    return value, position + size


def scan_records(
    data: bytes | bytearray | memoryview,
    start: int,
    count: int,
    keyless: list[int] | None = None,
    fields: list[RecordFields] | None = None,
    produced: bool = True,
) -> None:
    """Check that `data[start:]` holds exactly `count` well-formed records; see `walk_records`,
    which this is, compiled (`_recordscan`) when nobody asks where the fields are."""
    if fields is None and _compiled is not None:
        try:
            _compiled.scan(data, start, count, keyless, produced)
        except ValueError as error:
            raise RecordFormatError(str(error)) from None
        return
    walk_records(data, start, count, keyless, fields, produced)


def walk_records(
    data: bytes | bytearray | memoryview,
    start: int,
    count: int,
    keyless: list[int] | None = None,
    fields: list[RecordFields] | None = None,
    produced: bool = True,
) -> None:
    """Check that `data[start:]` holds exactly `count` well-formed records (Kafka's record
    iterator) and, for a batch as a producer sends it (`produced`), that their offset deltas run
    0, 1, 2, ...; a stored batch that compaction thinned keeps the deltas of the records it kept.
    Raises RecordFormatError.

    Reads no key or value: it skips them by their lengths. `keyless` collects the indexes of
    records without a key; `fields` where each record's parts are. Single-byte varints (nearly
    every field of a real record) are read inline: this runs for every record produced."""
    if not isinstance(data, bytes):
        data = memoryview(data).toreadonly()  # kio's native readers take read-only buffers only
    end = len(data)
    position = start
    index = 0
    try:
        for index in range(count):
            prefix_at = position
            byte = data[position]
            if byte < 0x80:
                length = (byte >> 1) ^ -(byte & 1)
                position += 1
            else:
                length, position = _varint(data, position)
            record_start = position
            record_end = position + length
            if length < _MIN_RECORD_BODY or record_end > end:
                raise RecordFormatError(f"record {index} claims {length} bytes; {end - position} remain")
            position += 1  # attributes: unused in v2
            byte = data[position]
            if byte < 0x80:
                timestamp_delta = (byte >> 1) ^ -(byte & 1)
                position += 1
            else:
                timestamp_delta, position = _varlong(data, position)
            byte = data[position]
            if byte < 0x80:
                offset_delta = (byte >> 1) ^ -(byte & 1)
                position += 1
            else:
                offset_delta, position = _varint(data, position)
            if offset_delta != index and produced:
                raise RecordFormatError(f"record {index} has offset delta {offset_delta}")
            byte = data[position]
            if byte < 0x80:
                key_length = (byte >> 1) ^ -(byte & 1)
                position += 1
            else:
                key_length, position = _varint(data, position)
            key_at = position
            if key_length >= 0:
                position += key_length
            elif key_length != -1:
                raise RecordFormatError(f"record {index} has key length {key_length}")
            elif keyless is not None:
                keyless.append(index)
            byte = data[position]
            if byte < 0x80:
                value_length = (byte >> 1) ^ -(byte & 1)
                position += 1
            else:
                value_length, position = _varint(data, position)
            value_at = position
            if value_length >= 0:
                position += value_length
            elif value_length != -1:
                raise RecordFormatError(f"record {index} has value length {value_length}")
            byte = data[position]
            if byte:  # headers
                position = _skip_headers(data, position, record_end, index)
            else:
                position += 1
            if position != record_end:
                raise RecordFormatError(
                    f"record {index} declares {length} bytes but its fields take {position - record_start}"
                )
            if fields is not None:
                fields.append(
                    RecordFields(
                        prefix_at,
                        record_end,
                        timestamp_delta,
                        offset_delta,
                        key_at,
                        key_length,
                        value_at,
                        value_length,
                    )
                )
    except IndexError:
        raise RecordFormatError(f"record {index} runs past the end of the batch") from None
    if position != end:
        raise RecordFormatError(f"{end - position} bytes follow the {count} records the batch declares")


def _skip_headers(data: bytes | bytearray | memoryview, position: int, record_end: int, index: int) -> int:
    count, position = _varint(data, position)
    # Each header takes at least two bytes (a key length and a value length).
    if count < 0 or position + 2 * count > record_end:
        raise RecordFormatError(f"record {index} declares {count} headers")
    for _ in range(count):
        key_length, position = _varint(data, position)
        if key_length < 0:
            raise RecordFormatError(f"record {index} has a header without a key")
        value_length, position = _varint(data, position + key_length)
        if value_length < -1:
            raise RecordFormatError(f"record {index} has a header value length {value_length}")
        position += max(value_length, 0)
        if position > record_end:
            raise RecordFormatError(f"record {index}'s headers run past its end")
    return position


def decompress(codec: int, data: bytes | bytearray | memoryview, cap: int = MAX_UNCOMPRESSED_BYTES) -> bytes:
    """The records section of a batch compressed with `codec` (Kafka's attribute bits), at
    most `cap` bytes: past that, or on any error, CorruptCompressionError."""
    try:
        if codec == 1:
            return _gunzip(data, cap)
        if codec == 2:
            return _unsnappy(bytes(data), cap)
        if codec in (3, 4):
            module = cramjam.lz4 if codec == 3 else cramjam.zstd
            return _decompress_growing(module, data, cap)
    except (cramjam.DecompressionError, zlib.error, struct.error, ValueError) as error:
        if isinstance(error, CorruptCompressionError):
            raise
        name = COMPRESSION_CODECS[codec]
        raise CorruptCompressionError(f"cannot inflate the {name} records: {error}") from None
    raise CorruptCompressionError(f"unknown compression codec {codec}")


def _too_big(cap: int) -> CorruptCompressionError:
    return CorruptCompressionError(f"the records inflate past {cap} bytes")


def _gunzip(data: bytes | bytearray | memoryview, cap: int) -> bytes:
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib framing
    out = inflater.decompress(data, cap + 1)
    if len(out) > cap or inflater.unconsumed_tail:
        raise _too_big(cap)
    return out


def _decompress_growing(module: object, data: bytes | bytearray | memoryview, cap: int) -> bytes:
    """Decompress into a buffer that doubles up to `cap`: cramjam stops with an error as soon
    as the output would not fit, so a bomb costs at most `cap` bytes and the work to fill them."""
    size = min(cap, max(_FIRST_GROWTH, 4 * len(data)))
    while True:
        buffer = bytearray(size)
        try:
            written = module.decompress_into(bytes(data), buffer)  # type: ignore[attr-defined]
        except cramjam.DecompressionError as error:
            if "whole buffer" not in str(error):
                raise
            if size >= cap:
                raise _too_big(cap) from None
            size = min(cap, size * 2)
            continue
        return bytes(memoryview(buffer)[:written])


def _unsnappy(data: bytes, cap: int) -> bytes:
    """Raw snappy, or the Java client's xerial framing (length-prefixed raw blocks); every
    block says how long it inflates before it is inflated."""
    if not data.startswith(_XERIAL_MAGIC):
        blocks = [data]
    else:
        blocks, position = [], _XERIAL_HEADER.size
        while position < len(data):
            (length,) = _XERIAL_BLOCK_LENGTH.unpack_from(data, position)
            position += _XERIAL_BLOCK_LENGTH.size
            if length < 0 or position + length > len(data):
                raise CorruptCompressionError("a snappy block runs past the batch")
            blocks.append(data[position : position + length])
            position += length
    total = sum(cramjam.snappy.decompress_raw_len(block) for block in blocks)
    if total > cap:
        raise _too_big(cap)
    return b"".join(bytes(cramjam.snappy.decompress_raw(block)) for block in blocks)


def compress(codec: int, data: bytes, level: int | None = None) -> bytes:
    """The records section compressed with `codec`, as Kafka's clients frame it (gzip, raw
    snappy, the LZ4 frame format, zstd), at `level` (None or -1: the codec's default)."""
    if level is not None and level < 0:
        level = None  # gzip's -1
    if codec == 1:
        return bytes(cramjam.gzip.compress(data, level))
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == 3:
        return bytes(cramjam.lz4.compress(data, level))
    if codec == 4:
        return bytes(cramjam.zstd.compress(data, level))
    raise ValueError(f"unknown compression codec {codec}")
