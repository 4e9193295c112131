"""The coordinators' internal topics, and which of their partitions holds a key, as Kafka places it.

The coordinator of group `g` is the leader of `__consumer_offsets` partition
`Utils.abs(g.hashCode()) % partitions`, of transactional id `t` the leader of
`__transaction_state` partition `Utils.abs(t.hashCode()) % partitions`. Java's `String.hashCode`
runs over UTF-16 code units in 32-bit arithmetic, and Kafka's `Utils.abs` maps Integer.MIN_VALUE,
which has no positive twin, to 0. The same keys land on the same partitions as in Kafka, so a
client's coordinator lookups and an operator's reading of the internal topics agree with it.
"""

from __future__ import annotations

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_LOG = "__transaction_state"
_MASK = 0xFFFFFFFF


def java_string_hash(key: str) -> int:
    """Java's `String.hashCode()`: s[0]*31^(n-1) + ... + s[n-1] over the UTF-16 code units, as
    a signed 32-bit integer."""
    value = 0
    units = key.encode("utf-16-be", "surrogatepass")
    for index in range(0, len(units), 2):
        value = (value * 31 + (units[index] << 8 | units[index + 1])) & _MASK
    return value - (1 << 32) if value & 0x80000000 else value


def kafka_abs(value: int) -> int:
    """Kafka's `Utils.abs`: |value|, and 0 for Integer.MIN_VALUE."""
    return 0 if value == -(1 << 31) else abs(value)


def partition_for(key: str, partitions: int) -> int:
    """The internal partition that holds `key`'s state, among `partitions`."""
    return kafka_abs(java_string_hash(key)) % partitions
