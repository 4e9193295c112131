"""confluent-kafka, kafka-python and aiokafka producers and a consumer group keep going, each
without a restart, while the partition's leader is SIGKILLed and the controller elects another."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError as AIOKafkaError
from confluent_kafka import Consumer, Producer
from kafka import KafkaProducer
from kafka.errors import KafkaError

from tests.cluster_mode.conftest import Cluster
from tests.cluster_mode.test_zookeeper_cluster import create_topic
from tests.conftest import wait_until

pytestmark = pytest.mark.zookeeper

TOPIC = "moves"
SEND_TIMEOUT_S = 20


@dataclass
class Sender:
    """One client's producer loop on a thread: a record at a time, each value kept once the
    broker acknowledged it (an error is only an unacknowledged record: the loop goes on)."""

    name: str
    stop: threading.Event = field(default_factory=threading.Event)
    acknowledged: list[bytes] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def value(self) -> bytes:
        return b"%s-%d" % (self.name.encode(), len(self.acknowledged) + len(self.errors))

    def start(self, loop: Callable[[Sender], None]) -> Sender:
        self.thread = threading.Thread(target=loop, args=(self,), daemon=True)
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=SEND_TIMEOUT_S + 10)
        assert not self.thread.is_alive(), f"{self.name} hangs"


def keep_error(outcome: list[object]) -> Callable[[object, object], None]:
    return lambda error, _message: outcome.append(error)


def confluent_loop(bootstrap: str) -> Callable[[Sender], None]:
    def loop(sender: Sender) -> None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 0,
                "message.timeout.ms": SEND_TIMEOUT_S * 1000,
            }
        )
        while not sender.stop.is_set():
            value = sender.value()
            outcome: list[object] = []
            producer.produce(TOPIC, value=value, on_delivery=keep_error(outcome))
            producer.flush(SEND_TIMEOUT_S)
            if outcome == [None]:
                sender.acknowledged.append(value)
            else:
                sender.errors.append(repr(outcome))

    return loop


def kafka_python_loop(bootstrap: str) -> Callable[[Sender], None]:
    def loop(sender: Sender) -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        while not sender.stop.is_set():
            value = sender.value()
            try:
                producer.send(TOPIC, value).get(timeout=SEND_TIMEOUT_S)
                sender.acknowledged.append(value)
            except KafkaError as error:
                sender.errors.append(repr(error))
        producer.close(timeout=5)

    return loop


def aiokafka_loop(bootstrap: str) -> Callable[[Sender], None]:
    async def send_all(sender: Sender) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        try:
            while not sender.stop.is_set():
                value = sender.value()
                try:
                    await asyncio.wait_for(producer.send_and_wait(TOPIC, value), SEND_TIMEOUT_S)
                    sender.acknowledged.append(value)
                except (AIOKafkaError, TimeoutError) as error:
                    sender.errors.append(repr(error))
        finally:
            await producer.stop()

    return lambda sender: asyncio.run(send_all(sender))


def test_producers_and_a_consumer_group_follow_a_leader_change(cluster: Cluster) -> None:
    create_topic(cluster, TOPIC, 1, 3, **{"min.insync.replicas": "2"})
    before = cluster.wait_for_leader(TOPIC)
    bootstrap = cluster.bootstrap_servers  # the killed broker stays in it, as in a client's config
    senders = [
        Sender("confluent").start(confluent_loop(bootstrap)),
        Sender("kafka-python").start(kafka_python_loop(bootstrap)),
        Sender("aiokafka").start(aiokafka_loop(bootstrap)),
    ]
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "followers", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([TOPIC])
    read: list[bytes] = []

    def consumed_some() -> bool:
        read.extend(m.value() for m in consumer.consume(50, 0.2) if not m.error())
        return True

    try:
        wait_until(lambda: consumed_some() and all(len(s.acknowledged) >= 3 for s in senders), timeout_s=60)
        cluster.brokers[before.leader_id].kill()
        acknowledged_at_kill = [len(sender.acknowledged) for sender in senders]
        after = cluster.wait_for_leader(TOPIC, not_on=before.leader_id)
        assert after.leader_epoch > before.leader_epoch
        # Each producer goes on with the same client object: more acknowledged after the move.
        try:
            wait_until(
                lambda: (
                    consumed_some()
                    and all(
                        len(sender.acknowledged) >= count + 3
                        for sender, count in zip(senders, acknowledged_at_kill, strict=True)
                    )
                ),
                timeout_s=60,  # generous for a loaded machine: passing runs take a few seconds
            )
        except TimeoutError:
            progress = zip(senders, acknowledged_at_kill, strict=True)
            stuck = [(s.name, at_kill, len(s.acknowledged), s.errors) for s, at_kill in progress]
            raise AssertionError(f"(sender, acknowledged at the kill, now, errors): {stuck}") from None
    finally:
        for sender in senders:
            sender.finish()
    acknowledged = {value for sender in senders for value in sender.acknowledged}
    # The group reads every acknowledged record, the ones from after the move included.
    wait_until(lambda: consumed_some() and acknowledged <= set(read), timeout_s=60)
    consumer.close()
