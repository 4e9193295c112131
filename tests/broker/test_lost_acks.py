"""An idempotent producer behind a proxy that destroys responses: no loss, no duplicates, order kept."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker
from onceflow.faults.proxy import FaultPlan, FaultProxy

pytestmark = pytest.mark.soak

MESSAGES = 3000
PARTITIONS = 3


def _produce_through(proxy_address: str, idempotent: bool) -> tuple[list[str], list[str]]:
    producer = Producer(
        {
            "bootstrap.servers": proxy_address,
            "enable.idempotence": idempotent,
            "acks": "all",
            "linger.ms": 5,
            "batch.num.messages": 50,
            "message.timeout.ms": 60_000,
            "socket.timeout.ms": 2_000,
            "reconnect.backoff.ms": 10,
            "reconnect.backoff.max.ms": 100,
            "retry.backoff.ms": 10,
        }
    )
    acked: list[str] = []
    failed: list[str] = []

    def on_delivery(error: KafkaError | None, message: object) -> None:
        (failed if error is not None else acked).append(message.value().decode())  # type: ignore[attr-defined]

    for number in range(MESSAGES):
        producer.produce("lossy", key=str(number % 13), value=f"v-{number}", on_delivery=on_delivery)
        if number % 100 == 0:
            producer.poll(0.01)
    assert producer.flush(90) == 0
    return acked, failed


def _read_back(bootstrap: str) -> dict[int, list[str]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.partition.eof": True})
    consumer.assign([TopicPartition("lossy", partition, 0) for partition in range(PARTITIONS)])
    values: dict[int, list[str]] = defaultdict(list)
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    while len(at_end) < PARTITIONS and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=0.5):
            if message.error() is not None:
                at_end.add(message.partition())
            else:
                values[message.partition()].append(message.value().decode())
    consumer.close()
    return values


@contextmanager
def _behind_proxy(tmp_path: Path, plan: FaultPlan) -> Iterator[tuple[FaultProxy, EmbeddedBroker]]:
    """A broker whose clients reach it through a proxy that follows `plan`, with the topic made."""
    with FaultProxy(plan) as proxy:
        config = {"advertised.listeners": f"PLAINTEXT://{proxy.address}"}
        with EmbeddedBroker(tmp_path / "data", config=config) as broker:
            proxy.upstream = ("127.0.0.1", broker.port)
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            admin.create_topics([NewTopic("lossy", PARTITIONS, 1)])["lossy"].result(timeout=30)
            yield proxy, broker


def _run(tmp_path: Path, idempotent: bool) -> tuple[list[str], list[str], dict[int, list[str]], int]:
    plan = FaultPlan(drop_response_probability=0.08, max_faults=40, seed=7)
    with _behind_proxy(tmp_path, plan) as (proxy, broker):
        acked, failed = _produce_through(proxy.address, idempotent)
        stored = _read_back(broker.bootstrap_servers)
        return acked, failed, stored, proxy.responses_dropped


def test_idempotent_producer_survives_lost_acks(tmp_path: Path) -> None:
    _acked, failed, stored, dropped = _run(tmp_path, idempotent=True)
    assert dropped >= 5, "the proxy destroyed too few responses to prove anything"
    assert not failed
    values = [value for partition in stored.values() for value in partition]
    assert len(values) == len(set(values)) == MESSAGES, "lost or duplicated values"
    for partition in stored.values():
        per_key: dict[int, list[int]] = defaultdict(list)
        for value in partition:
            number = int(value.split("-")[1])
            per_key[number % 13].append(number)
        assert all(numbers == sorted(numbers) for numbers in per_key.values())


def test_without_idempotence_lost_acks_duplicate(tmp_path: Path) -> None:
    """The same faults without idempotence store retried batches twice: the test above can fail."""
    _acked, _failed, stored, dropped = _run(tmp_path, idempotent=False)
    values = [value for partition in stored.values() for value in partition]
    assert dropped >= 5
    assert len(values) > len(set(values))


@pytest.mark.parametrize("drop_next_write_response", [True, False])
def test_the_next_answer_to_a_write_is_lost_when_asked(
    tmp_path: Path, drop_next_write_response: bool
) -> None:
    """The lab's fallback when its lost-acks window lost no ack: exactly one answer is destroyed,
    an answer to a write (Produce here); without the flag, none."""
    plan = FaultPlan(drop_next_write_response=drop_next_write_response)
    with _behind_proxy(tmp_path, plan) as (proxy, broker):
        producer = Producer(
            {"bootstrap.servers": proxy.address, "enable.idempotence": True, "socket.timeout.ms": 2_000}
        )
        for number in range(10):
            producer.produce("lossy", value=f"v-{number}")
            producer.flush(30)
        assert producer.flush(30) == 0
        stored = _read_back(broker.bootstrap_servers)
    assert proxy.responses_dropped == proxy.acks_lost == int(drop_next_write_response)
    assert not plan.drop_next_write_response
    # The idempotent producer's retry of the lost ack's batch stored nothing twice.
    assert sorted(value for values in stored.values() for value in values) == sorted(
        f"v-{n}" for n in range(10)
    )
