"""Helpers shared by tests that read topics back with a real client."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition


@dataclass(frozen=True)
class Read:
    partition: int
    offset: int
    key: bytes | None
    value: str


def read_to_end(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation: str = "read_uncommitted",
    timeout_s: float = 60,
    config: dict[str, str] | None = None,
) -> dict[int, list[Read]]:
    """Every record of `topic` from offset 0 up to the end (the LSO for read_committed), per
    partition; `config` adds client settings (TLS, SASL)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "read-to-end",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            **(config or {}),
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0) for partition in range(partitions)])
    records: dict[int, list[Read]] = defaultdict(list)
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.2):
                error = message.error()
                if error is None:
                    value = message.value()
                    assert value is not None
                    records[message.partition()].append(
                        Read(message.partition(), message.offset(), message.key(), value.decode())
                    )
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                else:
                    raise AssertionError(f"reading {topic}: {error}")
    finally:
        consumer.close()
    assert len(at_end) == partitions, f"{topic}: never reached the end of every partition (is the LSO stuck?)"
    return records


def values(records: dict[int, list[Read]]) -> list[str]:
    return [read.value for partition in sorted(records) for read in records[partition]]
