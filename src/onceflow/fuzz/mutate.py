"""Seeded mutations of recorded request frames, the way an attacker or a broken client bends them.

Each mutation takes a seed frame (without its length prefix) and returns the frames to send:
usually one, two for a duplicated request.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from crc32c import crc32c

from onceflow.protocol.bounds import FrameBoundsError, IntField, int_fields
from onceflow.protocol.codec import (
    MalformedRequestError,
    UnknownApiError,
    decode_request,
    encode_request,
    request_type,
)
from onceflow.records import compress

_PREFIX = struct.Struct(">hh")
PRODUCE = 0
# Where a v2 batch keeps what the record-batch lies change.
_LENGTH_AT, _CRC_AT, _ATTRIBUTES_AT, _LAST_OFFSET_DELTA_AT, _COUNT_AT, _RECORDS_AT = 8, 17, 21, 23, 57, 61
_LOG_OVERHEAD = 12
_BOUNDARIES = {
    1: (0, 1, 0x7F, 0x80, 0xFF),
    2: (0, 1, 0x7FFF, 0x8000, 0xFFFF, 0x00FF, 0x0100),
    4: (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0x0000FFFF, 0x00010000),
    8: (0, 1, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 0xFFFFFFFFFFFFFFFF, 0x00000000FFFFFFFF),
}


@dataclass(frozen=True)
class Seed:
    frame: bytes
    api_key: int
    integers: tuple[IntField, ...]


def make_seed(frame: bytes) -> Seed:
    api_key, api_version = _PREFIX.unpack_from(frame)
    return Seed(frame, api_key, _integers(frame, api_key, api_version))


def _integers(frame: bytes, api_key: int, api_version: int) -> tuple[IntField, ...]:
    try:
        body_class = request_type(api_key, api_version)
        return tuple(int_fields(frame, body_class.__header_schema__, body_class))
    except (UnknownApiError, FrameBoundsError):
        return ()


def bit_flips(rng: random.Random, seed: Seed, seeds: Sequence[Seed]) -> list[bytes]:
    frame = bytearray(seed.frame)
    for _ in range(rng.randint(1, 8)):
        frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
    return [bytes(frame)]


def truncation(rng: random.Random, seed: Seed, seeds: Sequence[Seed]) -> list[bytes]:
    return [seed.frame[: rng.randrange(4, len(seed.frame))]] if len(seed.frame) > 4 else [seed.frame]


def extension(rng: random.Random, seed: Seed, seeds: Sequence[Seed]) -> list[bytes]:
    return [seed.frame + rng.randbytes(rng.randint(1, 64))]


def boundary_integer(rng: random.Random, seed: Seed, seeds: Sequence[Seed]) -> list[bytes]:
    """One integer field, a length or count included, set to a boundary value of its width."""
    if not seed.integers:
        return bit_flips(rng, seed, seeds)
    field = rng.choice(seed.integers[2:] or seed.integers)  # keep api key and version mostly
    value = rng.choice(_BOUNDARIES[field.width])
    if field.is_length and rng.random() < 0.3:
        # Just past what remains: the classic off-by-one of a length check.
        value = len(seed.frame) - field.offset - field.width + rng.choice((-1, 1, 2))
    frame = bytearray(seed.frame)
    frame[field.offset : field.offset + field.width] = (value % (1 << (8 * field.width))).to_bytes(
        field.width, "big"
    )
    return [bytes(frame)]


def splice(rng: random.Random, seed: Seed, seeds: Sequence[Seed]) -> list[bytes]:
    other = rng.choice(seeds).frame
    return [seed.frame[: rng.randrange(4, len(seed.frame) + 1)] + other[rng.randrange(len(other)) :]]


def record_batch(rng: random.Random, seed: Seed, seeds: Sequence[Seed]) -> list[bytes]:
    """A Produce whose batch lies inside while its CRC stays right, so that the broker's record
    validator, not its CRC check, has to refuse it: a record count that is not the records', a
    varint far too long, offset deltas that repeat, records cut short or followed by more, a codec
    the bytes are not in, or a few KiB that inflate past the broker's cap."""
    if seed.api_key != PRODUCE:
        return bit_flips(rng, seed, seeds)
    try:
        header, body = decode_request(seed.frame)
    except MalformedRequestError:
        return bit_flips(rng, seed, seeds)
    topics = list(body.topic_data)
    for topic_index, topic in enumerate(topics):
        for partition_index, data in enumerate(topic.partition_data):
            if data.records and len(data.records) > _RECORDS_AT:
                batch = rng.choice(_BATCH_LIES)(rng, bytearray(data.records))
                struct.pack_into(">i", batch, _LENGTH_AT, len(batch) - _LOG_OVERHEAD)
                struct.pack_into(">I", batch, _CRC_AT, crc32c(memoryview(batch)[_ATTRIBUTES_AT:]))
                partitions = list(topic.partition_data)
                partitions[partition_index] = dataclasses.replace(data, records=bytes(batch))
                topics[topic_index] = dataclasses.replace(topic, partition_data=tuple(partitions))
                frame = encode_request(header, dataclasses.replace(body, topic_data=tuple(topics)))
                return [frame[4:]]
    return bit_flips(rng, seed, seeds)


def _lying_count(rng: random.Random, batch: bytearray) -> bytearray:
    count = rng.choice((0, 1, 2, 1000, 0x7FFFFFFF)) or rng.randint(1, 10)
    struct.pack_into(">i", batch, _COUNT_AT, count)
    struct.pack_into(">i", batch, _LAST_OFFSET_DELTA_AT, count - 1)
    return batch


def _long_varint(rng: random.Random, batch: bytearray) -> bytearray:
    at = rng.randrange(_RECORDS_AT, len(batch))
    return batch[:at] + b"\xff" * rng.choice((6, 11, 100, 100_000)) + batch[at:]


def _repeated_offset_deltas(rng: random.Random, batch: bytearray) -> bytearray:
    # The first record's offset delta sits after its length, attributes and timestamp delta.
    at = _RECORDS_AT + rng.choice((2, 3, 4))
    if at < len(batch):
        batch[at] = rng.choice((0, 2, 0x7F))
    return batch


def _cut_or_padded(rng: random.Random, batch: bytearray) -> bytearray:
    if rng.random() < 0.5:
        return batch[: rng.randrange(_RECORDS_AT, len(batch))]
    return batch + rng.randbytes(rng.randint(1, 32))


def _wrong_codec(rng: random.Random, batch: bytearray) -> bytearray:
    (attributes,) = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)
    struct.pack_into(">h", batch, _ATTRIBUTES_AT, (attributes & ~0x07) | rng.randint(1, 7))
    return batch


def _bomb(rng: random.Random, batch: bytearray) -> bytearray:
    codec = rng.randint(1, 4)
    (attributes,) = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)
    struct.pack_into(">h", batch, _ATTRIBUTES_AT, (attributes & ~0x07) | codec)
    return batch[:_RECORDS_AT] + _bombs(codec)


@functools.cache
def _bombs(codec: int) -> bytes:
    """80 MiB of zeros (past the broker's 64 MiB cap) in a few KiB, made once per codec."""
    return compress(codec, bytes(80 << 20))


# The bomb costs the broker its whole inflation cap of work: one in twenty-one lies.
_CHEAP_LIES = (_lying_count, _long_varint, _repeated_offset_deltas, _cut_or_padded, _wrong_codec)
_BATCH_LIES = (*_CHEAP_LIES * 4, _bomb)


def duplicate(rng: random.Random, seed: Seed, seeds: Sequence[Seed]) -> list[bytes]:
    """The same request twice, as a client that retries without waiting does."""
    mutated = rng.choice(MUTATIONS[:-1])(rng, seed, seeds)[0] if rng.random() < 0.5 else seed.frame
    return [mutated, mutated]


Mutation = Callable[[random.Random, Seed, Sequence[Seed]], list[bytes]]
MUTATIONS: tuple[Mutation, ...] = (
    bit_flips,
    truncation,
    extension,
    boundary_integer,
    splice,
    record_batch,
    duplicate,  # last: it applies one of the others
)
