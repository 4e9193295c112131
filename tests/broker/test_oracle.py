"""Differential test: the same client session against onceflow and the librdkafka mock cluster.

The mock cluster is librdkafka's own in-process broker (`test.mock.num.brokers`). Where it
behaves as Kafka does (offsets assigned, watermarks, what a consumer reads) both must agree.
Its gaps are not compared: it does not answer CreateTopics, and it answers every lookup by
timestamp with -1, so those are checked against the records themselves.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker

PARTITIONS = 4  # the mock cluster auto-creates topics with four partitions
TOPIC = "oracle"


def _session(bootstrap_config: dict[str, Any], create_topic: bool) -> dict[str, Any]:
    """Produce keyed messages, then observe everything a client can see."""
    if create_topic:  # the mock cluster does not answer CreateTopics
        admin = AdminClient(bootstrap_config)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=30)
    producer = Producer({**bootstrap_config, "enable.idempotence": True, "linger.ms": 20})
    start_ms = int(time.time() * 1000)
    deliveries: list[tuple[str, int, int]] = []

    def on_delivery(error: KafkaError | None, message: Any) -> None:
        assert error is None, error
        deliveries.append((message.key().decode(), message.partition(), message.offset()))

    for number in range(200):
        producer.produce(
            TOPIC,
            key=f"k{number % 17}",
            value=f"v{number}",
            on_delivery=on_delivery,
            timestamp=start_ms + number,
        )
    assert producer.flush(30) == 0

    consumer = Consumer({**bootstrap_config, "group.id": "oracle", "enable.auto.commit": False})
    watermarks = [
        consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10) for p in range(PARTITIONS)
    ]
    lookups = consumer.offsets_for_times(
        [TopicPartition(TOPIC, p, start_ms + 150) for p in range(PARTITIONS)], timeout=10
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    records: list[tuple[int, int, str, str, int]] = []
    deadline = time.monotonic() + 30
    while len(records) < 200 and time.monotonic() < deadline:
        for message in consumer.consume(500, timeout=0.2):
            if message.error() is None:
                records.append(
                    (
                        message.partition(),
                        message.offset(),
                        message.key().decode(),
                        message.value().decode(),
                        message.timestamp()[1],
                    )
                )
    consumer.close()
    return {
        "deliveries": sorted(deliveries),
        "watermarks": watermarks,
        "lookups": sorted((tp.partition, tp.offset) for tp in lookups),
        "start_ms": start_ms,
        "records": sorted(records),
    }


def test_onceflow_agrees_with_the_librdkafka_mock_cluster() -> None:
    # The mock cluster lives inside the client that starts it; other clients reach it by address.
    owner = Producer({"test.mock.num.brokers": 1})
    mock_broker = next(iter(owner.list_topics(timeout=10).brokers.values()))
    mock = _session({"bootstrap.servers": f"{mock_broker.host}:{mock_broker.port}"}, create_topic=False)
    del owner
    with EmbeddedBroker() as broker:
        ours = _session({"bootstrap.servers": broker.bootstrap_servers}, create_topic=True)
    assert len(ours["records"]) == 200
    for key in ("deliveries", "watermarks"):
        assert ours[key] == mock[key], key
    strip_timestamps = [record[:4] for record in ours["records"]]
    assert strip_timestamps == [record[:4] for record in mock["records"]]
    # Lookups by time: the first record of each partition stamped at or after the target.
    target = ours["start_ms"] + 150
    for partition, offset in ours["lookups"]:
        stamped = [(o, ts) for p, o, _, _, ts in ours["records"] if p == partition and ts >= target]
        assert offset == (stamped[0][0] if stamped else -1)
