"""The fuzzer's seed corpus: the request frames real clients send, recorded through the fault proxy.

confluent-kafka (librdkafka), kafka-python and aiokafka each produce, consume in a group, run a
transaction that commits offsets, and use the admin APIs, against a broker that advertises the
proxy, so every connection passes through it.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

from onceflow.admin.client import Cluster

_PREFIX = struct.Struct(">hh")
CLIENT_TIMEOUT_S = 30.0


@dataclass
class Corpus:
    frames: list[bytes] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, frame: bytes) -> None:
        with self._lock:
            self.frames.append(frame)

    def api_keys(self) -> set[int]:
        return {_PREFIX.unpack_from(frame)[0] for frame in self.frames if len(frame) >= 4}


def record(bootstrap: str) -> None:
    """Run every client's workload against `bootstrap` (the proxy that records)."""
    tag = uuid.uuid4().hex[:6]
    for workload in WORKLOADS:
        workload(bootstrap, f"fz-{workload.__name__.strip('_')}-{tag}")


def _confluent(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(CLIENT_TIMEOUT_S)
    admin.create_partitions([NewPartitions(name, 3)])[name].result(CLIENT_TIMEOUT_S)
    for future in admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)]).values():
        future.result(CLIENT_TIMEOUT_S)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for number in range(30):
        producer.produce(name, key=str(number % 4), value=f"value-{number}")
    producer.flush(CLIENT_TIMEOUT_S)

    group = f"{name}-group"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([name])
    seen = 0
    for _ in range(200):
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            seen += 1
            if seen >= 10:
                break
    consumer.commit(asynchronous=False)
    consumer.committed([TopicPartition(name, 0)], timeout=CLIENT_TIMEOUT_S)
    consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=CLIENT_TIMEOUT_S)

    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{name}-txn"})
    transactional.init_transactions(CLIENT_TIMEOUT_S)
    for commit in (True, False):
        transactional.begin_transaction()
        transactional.produce(name, key="txn", value=f"in-transaction-{commit}")
        transactional.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), CLIENT_TIMEOUT_S
        )
        if commit:
            transactional.commit_transaction(CLIENT_TIMEOUT_S)
        else:
            transactional.abort_transaction(CLIENT_TIMEOUT_S)
    consumer.close()

    admin.list_consumer_groups().result(CLIENT_TIMEOUT_S)
    admin.describe_consumer_groups([group])[group].result(CLIENT_TIMEOUT_S)
    with Cluster(bootstrap, CLIENT_TIMEOUT_S) as cluster:
        cluster.list_transactions()
        cluster.describe_transactions([f"{name}-txn"])
        cluster.describe_producers([(name, partition) for partition in range(3)])
    admin.delete_consumer_groups([group])[group].result(CLIENT_TIMEOUT_S)
    admin.delete_topics([name])[name].result(CLIENT_TIMEOUT_S)


def _kafka_python(bootstrap: str, name: str) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic as KafkaNewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    admin.create_topics([KafkaNewTopic(name, 2, 1)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    for number in range(20):
        producer.send(name, key=str(number).encode(), value=b"kafka-python")
    producer.flush(CLIENT_TIMEOUT_S)
    producer.close(CLIENT_TIMEOUT_S)
    consumer = KafkaConsumer(
        name,
        bootstrap_servers=bootstrap,
        group_id=f"{name}-group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    for count, _ in enumerate(consumer, start=1):
        if count >= 10:
            break
    consumer.commit()
    consumer.close()
    admin.list_groups()
    admin.describe_groups([f"{name}-group"])
    admin.list_group_offsets(f"{name}-group")
    admin.describe_topics([name])
    admin.list_transactions()
    admin.delete_groups([f"{name}-group"])
    admin.delete_topics([name])
    admin.close()


def _aiokafka(bootstrap: str, name: str) -> None:
    asyncio.run(_aiokafka_async(bootstrap, name))


async def _aiokafka_async(bootstrap: str, name: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for number in range(20):
            await producer.send_and_wait(name, key=str(number).encode(), value=b"aiokafka")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        name,
        bootstrap_servers=bootstrap,
        group_id=f"{name}-group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        await consumer.getmany(timeout_ms=3000, max_records=10)
        await consumer.commit()
    finally:
        await consumer.stop()


WORKLOADS: tuple[Callable[[str, str], None], ...] = (_confluent, _kafka_python, _aiokafka)
