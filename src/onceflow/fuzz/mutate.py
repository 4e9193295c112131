"""Seeded mutations of recorded request frames, the way an attacker or a broken client bends them.

Each mutation takes a seed frame (without its length prefix) and returns the frames to send:
usually one, two for a duplicated request.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onceflow.protocol.bounds import FrameBoundsError, IntField, int_fields
from onceflow.protocol.codec import UnknownApiError, request_type

_PREFIX = struct.Struct(">hh")
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


def duplicate(rng: random.Random, seed: Seed, seeds: Sequence[Seed]) -> list[bytes]:
    """The same request twice, as a client that retries without waiting does."""
    mutated = rng.choice(MUTATIONS[:-1])(rng, seed, seeds)[0] if rng.random() < 0.5 else seed.frame
    return [mutated, mutated]


Mutation = Callable[[random.Random, Seed, Sequence[Seed]], list[bytes]]
MUTATIONS: tuple[Mutation, ...] = (bit_flips, truncation, extension, boundary_integer, splice, duplicate)
