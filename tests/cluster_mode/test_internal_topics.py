"""Coordinator placement: `abs(javaStringHash(key)) % partitions`, as Kafka places groups and
transactional ids on the partitions of its internal topics."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.internal_topics import java_string_hash, kafka_abs, partition_for

# String.hashCode() values as a JVM prints them (jshell), including the one string every Java
# programmer meets whose hash is Integer.MIN_VALUE, which Math.abs leaves negative.
KNOWN = {
    "": 0,
    "a": 97,
    "Aa": 2112,
    "BB": 2112,
    "abc": 96354,
    "hello": 99162322,
    "Hello": 69609650,
    "hello world": 1794106052,
    "polygenelubricants": -(2**31),
}


@pytest.mark.parametrize(("key", "hash_code"), KNOWN.items())
def test_known_java_hash_codes(key: str, hash_code: int) -> None:
    assert java_string_hash(key) == hash_code


def test_integer_min_value_lands_on_partition_zero() -> None:
    assert kafka_abs(-(2**31)) == 0
    assert partition_for("polygenelubricants", 50) == 0
    # Python's abs would give 2**31, whose remainder is 48 for 50 partitions: Kafka's is 0.
    assert abs(-(2**31)) % 50 == 48


def _reference(key: str) -> int:
    """The definition, in unbounded integers: sum of the UTF-16 code units times powers of 31,
    then read as a two's-complement 32-bit value."""
    data = key.encode("utf-16-le", "surrogatepass")
    units = struct.unpack(f"<{len(data) // 2}H", data)
    total = sum(unit * 31 ** (len(units) - 1 - index) for index, unit in enumerate(units))
    return struct.unpack("<i", struct.pack("<I", total % 2**32))[0]


@given(st.text(max_size=64), st.integers(min_value=1, max_value=1000))
def test_placement_follows_the_java_definition(key: str, partitions: int) -> None:
    hash_code = java_string_hash(key)
    assert hash_code == _reference(key)
    placed = partition_for(key, partitions)
    assert 0 <= placed < partitions
    assert placed == (0 if hash_code == -(2**31) else abs(hash_code)) % partitions


def test_one_partition_holds_every_key() -> None:
    """Data directories from before the internal topics had partitions keep working: every key
    maps to the one partition there is."""
    assert {partition_for(key, 1) for key in ("g", "group-1", "txn-7", "polygenelubricants")} == {0}
