"""Each real client creates a topic, produces keyed messages, and reads them back in order."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker

PARTITIONS = 3
MESSAGES = 300


def _expected() -> list[tuple[str, str]]:
    return [(f"key-{number % 7}", f"value-{number}") for number in range(MESSAGES)]


def _check_per_partition_order(received: dict[int, list[tuple[str, str, int]]]) -> None:
    """Every message once; offsets increase; each key's values keep send order within its partition."""
    flat = [(key, value) for messages in received.values() for key, value, _ in messages]
    assert sorted(flat) == sorted(_expected())
    keys_seen_in: dict[str, int] = {}
    for partition, messages in received.items():
        offsets = [offset for _, _, offset in messages]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        per_key: dict[str, list[int]] = defaultdict(list)
        for key, value, _ in messages:
            assert keys_seen_in.setdefault(key, partition) == partition, "a key moved partitions"
            per_key[key].append(int(value.split("-")[1]))
        for numbers in per_key.values():
            assert numbers == sorted(numbers)


def test_confluent_kafka(broker: EmbeddedBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic("confluent", PARTITIONS, 1)])["confluent"].result(timeout=30)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True})
    for key, value in _expected():
        producer.produce("confluent", key=key, value=value)
    assert producer.flush(30) == 0

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("confluent", partition, 0) for partition in range(PARTITIONS)])
    received: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for _ in range(100):
        for message in consumer.consume(500, timeout=0.2):
            assert message.error() is None, message.error()
            received[message.partition()].append(
                (message.key().decode(), message.value().decode(), message.offset())
            )
        if sum(map(len, received.values())) >= MESSAGES:
            break
    consumer.close()
    _check_per_partition_order(received)


def test_kafka_python(broker: EmbeddedBroker) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    admin.create_topics([KNewTopic("kafka-python", PARTITIONS, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=True, acks="all")
    futures = [
        producer.send("kafka-python", key=key.encode(), value=value.encode()) for key, value in _expected()
    ]
    producer.flush(30)
    assert all(future.get(timeout=10) for future in futures)
    producer.close()

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False, consumer_timeout_ms=3000
    )
    consumer.assign([KTopicPartition("kafka-python", partition) for partition in range(PARTITIONS)])
    consumer.seek_to_beginning()
    received: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for message in consumer:
        received[message.partition].append((message.key.decode(), message.value.decode(), message.offset))
        if sum(map(len, received.values())) >= MESSAGES:
            break
    consumer.close()
    _check_per_partition_order(received)


def test_aiokafka(broker: EmbeddedBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as ANewTopic

    async def scenario() -> dict[int, list[tuple[str, str, int]]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        await admin.start()
        await admin.create_topics([ANewTopic("aiokafka", PARTITIONS, 1)])
        await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=True)
        await producer.start()
        try:
            sends = [
                await producer.send("aiokafka", key=key.encode(), value=value.encode())
                for key, value in _expected()
            ]
            await asyncio.gather(*sends)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await consumer.start()
        received: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
        try:
            consumer.assign([ATopicPartition("aiokafka", partition) for partition in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            while sum(map(len, received.values())) < MESSAGES:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 20)
                for tp, messages in batches.items():
                    for message in messages:
                        received[tp.partition].append(
                            (message.key.decode(), message.value.decode(), message.offset)
                        )
        finally:
            await consumer.stop()
        return received

    _check_per_partition_order(asyncio.run(scenario()))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="make setup installs kcat")
def test_kcat(broker: EmbeddedBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic("kcat", PARTITIONS, 1)])["kcat"].result(timeout=30)
    lines = "".join(f"{key}:{value}\n" for key, value in _expected())
    subprocess.run(
        ["kcat", "-b", broker.bootstrap_servers, "-P", "-t", "kcat", "-K:", "-X", "enable.idempotence=true"],
        input=lines,
        text=True,
        check=True,
        timeout=60,
    )
    listing = subprocess.run(
        ["kcat", "-b", broker.bootstrap_servers, "-L", "-J"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    topics = {topic["topic"]: topic for topic in json.loads(listing.stdout)["topics"]}
    assert len(topics["kcat"]["partitions"]) == PARTITIONS
    consumed = subprocess.run(
        [
            "kcat",
            "-b",
            broker.bootstrap_servers,
            "-C",
            "-t",
            "kcat",
            "-o",
            "beginning",
            "-e",
            "-c",
            str(MESSAGES),
            "-f",
            "%p %o %k %s\n",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    received: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for line in consumed.stdout.splitlines():
        partition, offset, key, value = line.split(" ")
        received[int(partition)].append((key, value, int(offset)))
    _check_per_partition_order(received)
