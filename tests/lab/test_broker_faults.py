"""The proxy's broker faults against the embedded broker, with real clients: each makes the broker
misbehave the way it claims, which the lab's negative controls rely on."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker
from onceflow.faults.proxy import FaultPlan, FaultProxy
from tests.conftest import FAST_JOINS, wait_until
from tests.wire import WireClient, make_batch

VALUES = [f"v-{number}" for number in range(20)]


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[FaultProxy, str]]:
    """A broker that advertises the proxy (so every client ends up behind it, also one that
    bootstraps from the broker's own address, which the fixture yields too)."""
    with FaultProxy(FaultPlan(seed=3, broker_fault_probability=1.0)) as proxy:
        config = {**FAST_JOINS, "advertised.listeners": f"PLAINTEXT://{proxy.address}"}
        with EmbeddedBroker(tmp_path / "data", config=config) as broker:
            proxy.upstream = ("127.0.0.1", broker.port)
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            admin.create_topics([NewTopic("t", 1, 1)])["t"].result(timeout=30)
            yield proxy, broker.bootstrap_servers


def _produce(bootstrap: str, **config: str | int | bool) -> list[tuple[str, int]]:
    """Sends VALUES one by one; the (value, offset) of each acknowledgement."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, **config})
    acked: list[tuple[str, int]] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        assert error is None, error
        acked.append((message.value().decode(), message.offset() or 0))  # type: ignore[union-attr]

    for value in VALUES:
        producer.produce("t", value=value, on_delivery=on_delivery)
        producer.flush(30)
    return acked


def _read(bootstrap: str, isolation: str = "read_committed") -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reader",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition("t", 0, 0)])
    values: list[str] = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(100, timeout=0.2):
                error = message.error()
                if error is None:
                    values.append(message.value().decode())  # type: ignore[union-attr]
                elif error.code() == KafkaError._PARTITION_EOF:
                    return values
        raise TimeoutError("never reached the end of the partition")
    finally:
        consumer.close()


@pytest.mark.timeout(60)
def test_duplicate_produce_defeats_the_idempotent_producer(proxied: tuple[FaultProxy, str]) -> None:
    proxy, direct = proxied
    proxy.plan.broker_fault = "duplicate-produce"
    _produce(proxy.address, **{"enable.idempotence": True})
    # An exact copy would be deduplicated by the broker; the copy without a producer id is not.
    assert Counter(_read(direct)) == {value: 2 for value in VALUES}
    assert proxy.broker_faults.produces_duplicated == len(VALUES)
    assert proxy.broker_faults.duplicated_values == VALUES


@pytest.mark.timeout(60)
def test_the_copies_counted_are_those_stored_also_when_clients_leave_first(
    proxied: tuple[FaultProxy, str],
) -> None:
    # Clients that send their writes and leave at once, before their answers (a reset, as the
    # answers they did not read are still in their sockets): the broker may store a copy after
    # that, and the lab's negative control needs the proxy's count to be exactly what it stored.
    proxy, direct = proxied
    proxy.plan.broker_fault = "duplicate-produce"
    sent = [[f"{client}-{value}" for value in VALUES] for client in range(5)]
    connections_before = proxy.connections_open  # the fixture's admin client's
    for client_values in sent:
        with WireClient(proxy.address) as client:
            for value in client_values:
                records = make_batch([value.encode()])
                _, frame = client.frame(
                    0,
                    9,
                    transactional_id=None,
                    acks=-1,
                    timeout=10_000,
                    topic_data=[{"name": "t", "partition_data": [{"index": 0, "records": records}]}],
                )
                client.send_raw(frame)
    wait_until(lambda: proxy.connections_open == connections_before, 30)  # their copies answered
    stored = Counter(_read(direct, "read_uncommitted"))
    assert (
        stored and set(stored) <= {value for values in sent for value in values} and max(stored.values()) <= 2
    )
    assert proxy.broker_faults.duplicated_values  # the precondition: copies were stored
    assert sorted(proxy.broker_faults.duplicated_values) == sorted(v for v, n in stored.items() if n == 2)


@pytest.mark.timeout(60)
def test_drop_acked_produce_acknowledges_writes_the_broker_never_saw(
    proxied: tuple[FaultProxy, str],
) -> None:
    proxy, direct = proxied
    proxy.plan.broker_fault = "drop-acked-produce"
    acked = _produce(proxy.address, **{"enable.idempotence": False})
    assert [value for value, _offset in acked] == VALUES
    assert _read(direct) == []
    assert proxy.broker_faults.dropped_values == VALUES


@pytest.mark.timeout(60)
def test_serve_aborted_hands_aborted_records_to_read_committed_readers(
    proxied: tuple[FaultProxy, str],
) -> None:
    proxy, direct = proxied
    producer = Producer({"bootstrap.servers": direct, "transactional.id": "aborter"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce("t", value="aborted")
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce("t", value="committed")
    producer.commit_transaction(30)

    assert _read(proxy.address) == ["committed"]  # no fault: the proxy passes Fetch through
    proxy.plan.broker_fault = "serve-aborted"
    assert _read(proxy.address) == ["aborted", "committed"]
    assert proxy.broker_faults.fetches_rewritten > 0


@pytest.mark.timeout(60)
def test_drop_acked_produce_forges_answers_to_produce_by_topic_id(proxied: tuple[FaultProxy, str]) -> None:
    """Produce v13 names topics by id (KIP-516): the forged answer must too."""
    proxy, direct = proxied
    proxy.plan.broker_fault = "drop-acked-produce"
    with WireClient(direct) as wire:
        metadata = wire.request(
            3,
            12,
            topics=[{"name": "t", "topic_id": None}],
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        topic_id = metadata.topics[0].topic_id
    with WireClient(proxy.address) as wire:
        response = wire.request(
            0,
            13,
            transactional_id=None,
            acks=-1,
            timeout=10_000,
            topic_data=[
                {"topic_id": topic_id, "partition_data": [{"index": 0, "records": make_batch([b"v"])}]}
            ],
        )
    assert response.responses[0].topic_id == topic_id
    assert response.responses[0].partition_responses[0].error_code == 0
    assert proxy.broker_faults.produces_dropped == 1
