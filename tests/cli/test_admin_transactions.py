"""`onceflow txn ...` on the operators' worst case: a transactional producer dies mid-transaction.

The dead producer's transaction pins the LSO of both partitions it wrote to, so read_committed
consumers stall. The broker's timeout sweep is switched off here, so only the tools end it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker
from onceflow.protocol.build import build
from onceflow.protocol.codec import encode_response, response_type
from onceflow.protocol.connection import Connection
from tests.cli.commands import admin, admin_json, onceflow

pytestmark = pytest.mark.timeout(90)

TRANSACTION_TIMEOUT_MS = 2000
COMMITTED = ["paid-0", "paid-1", "paid-2", "paid-3"]
LEFT_OPEN = ["stuck-0", "stuck-1", "stuck-2", "stuck-3", "stuck-4", "stuck-5"]

# Begins a transaction, writes to partitions 0 and 1, says "open" and waits to be SIGKILLed.
_OPEN_AND_WAIT = """
import sys
from confluent_kafka import Producer
bootstrap, transactional_id, timeout_ms, topic, *values = sys.argv[1:]
producer = Producer({
    "bootstrap.servers": bootstrap,
    "transactional.id": transactional_id,
    "transaction.timeout.ms": int(timeout_ms),
})
producer.init_transactions(30)
producer.begin_transaction()
for index, value in enumerate(values):
    producer.produce(topic, value.encode(), partition=index % 2)
assert producer.flush(30) == 0
print("open", flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(
        config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "3600000"}
    ) as running:
        yield running


def _create_topic(broker: EmbeddedBroker, topic: str) -> None:
    client = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    client.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)


def _commit_transaction(broker: EmbeddedBroker, topic: str, values: list[str]) -> None:
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"{topic}-writer"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for index, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=index % 2)
    producer.commit_transaction(30)


def _open_and_kill(broker: EmbeddedBroker, transactional_id: str, topic: str, values: list[str]) -> float:
    """Leave a transaction open by SIGKILLing its producer; returns when it was opened."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _OPEN_AND_WAIT,
            broker.bootstrap_servers,
            transactional_id,
            str(TRANSACTION_TIMEOUT_MS),
            topic,
            *values,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "open"
        return time.monotonic()
    finally:
        process.kill()
        process.wait(timeout=30)


def _read_committed(broker: EmbeddedBroker, topic: str) -> tuple[list[str], list[int]]:
    """What a read_committed consumer reads until it is told it is at the end, and its positions."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": "auditor",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    partitions = [TopicPartition(topic, partition, 0) for partition in (0, 1)]
    consumer.assign(partitions)
    values: list[str] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 20
    while len(at_end) < 2:
        assert time.monotonic() < deadline, "the consumer never reached the end"
        for message in consumer.consume(100, timeout=0.2):
            if message.error() is None:
                values.append(message.value().decode())
            elif message.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
    positions = [partition.offset for partition in consumer.position(partitions)]
    consumer.close()
    return sorted(values), positions


def _offsets(broker: EmbeddedBroker, topic: str) -> list[tuple[int, int]]:
    [described] = admin_json(broker, "topics", "describe", topic)
    return [(p["last_stable_offset"], p["end_offset"]) for p in described["partitions"]]


@pytest.mark.soak  # waits out a transaction timeout
def test_find_and_abort_a_hanging_transaction(broker: EmbeddedBroker) -> None:
    _create_topic(broker, "payments")
    _commit_transaction(broker, "payments", COMMITTED)  # offsets 0-1 and a marker at 2
    opened = _open_and_kill(broker, "stuck-payments", "payments", LEFT_OPEN)  # offsets 3-5

    listed = admin(broker, "txn", "list")
    assert any(line.split()[0::2] == ["stuck-payments", "Ongoing"] for line in listed.splitlines())
    listings = {row["transactional_id"]: row for row in admin_json(broker, "txn", "list")}
    assert listings["stuck-payments"]["state"] == "Ongoing"
    producer_id = listings["stuck-payments"]["producer_id"]

    [described] = admin_json(broker, "txn", "describe", "stuck-payments")
    assert described["state"] == "Ongoing"
    assert described["producer_id"] == producer_id
    assert described["timeout_ms"] == TRANSACTION_TIMEOUT_MS
    assert described["partitions"] == ["payments-0", "payments-1"]
    assert "payments-0, payments-1" in admin(broker, "txn", "describe", "stuck-payments")

    assert "open txn from offset" in admin(broker, "txn", "describe-producers", "payments", "0")
    producers = {
        row["producer_id"]: row for row in admin_json(broker, "txn", "describe-producers", "payments", "0")
    }
    assert producers[producer_id]["current_txn_start_offset"] == 3
    assert [row["current_txn_start_offset"] for pid, row in producers.items() if pid != producer_id] == [None]

    assert _offsets(broker, "payments") == [(3, 6), (3, 6)]
    # librdkafka's read_committed "end" is the LSO: the consumer stops before the open transaction.
    assert _read_committed(broker, "payments") == (COMMITTED, [3, 3])

    time.sleep(max(0.0, opened + TRANSACTION_TIMEOUT_MS / 1000 + 0.5 - time.monotonic()))
    hanging = admin(broker, "txn", "find-hanging")
    assert "open longer than its timeout" in hanging
    assert "2 open transaction(s), 2 hanging" in hanging
    rows = admin_json(broker, "txn", "find-hanging")
    assert [(row["topic"], row["partition"]) for row in rows] == [("payments", 0), ("payments", 1)]
    for row in rows:
        assert row["transactional_id"] == "stuck-payments"
        assert row["producer_id"] == producer_id
        assert (row["start_offset"], row["last_stable_offset"], row["end_offset"], row["lso_lag"]) == (
            3,
            3,
            6,
            3,
        )
        assert row["hanging"] is True
    assert admin_json(broker, "txn", "find-hanging", "--older-than-ms", "3600000") == []

    aborted = admin(broker, "txn", "abort", "stuck-payments")
    assert "aborted the open transaction of 'stuck-payments' on payments-0, payments-1" in aborted
    assert [line.split()[:3] for line in aborted.splitlines() if line.startswith(("before", "after"))] == [
        ["before", "stuck-payments", "Ongoing"],
        ["after", "stuck-payments", "Empty"],
    ]
    [after] = admin_json(broker, "txn", "describe", "stuck-payments")
    assert after["producer_epoch"] > described["producer_epoch"]

    assert _offsets(broker, "payments") == [(7, 7), (7, 7)]  # the abort markers took offset 6
    assert _read_committed(broker, "payments") == (COMMITTED, [7, 7])
    assert admin_json(broker, "txn", "find-hanging") == []


def test_abort_by_partition_and_producer_id(broker: EmbeddedBroker) -> None:
    _create_topic(broker, "refunds")
    _open_and_kill(broker, "stuck-refunds", "refunds", ["r-0", "r-1"])
    [open_producer] = [
        row
        for row in admin_json(broker, "txn", "describe-producers", "refunds", "1")
        if row["current_txn_start_offset"] is not None
    ]
    producer_id = str(open_producer["producer_id"])

    nothing = onceflow(
        "txn",
        "abort",
        "--topic",
        "refunds",
        "--partition",
        "1",
        "--producer-id",
        "123456789",
        "--bootstrap",
        broker.bootstrap_servers,
    )
    assert nothing.returncode == 1
    assert nothing.stderr == "onceflow txn abort: producer 123456789 has no open transaction on refunds-1\n"

    aborted = admin_json(
        broker, "txn", "abort", "--topic", "refunds", "--partition", "1", "--producer-id", producer_id
    )
    assert aborted["transactional_id"] == "stuck-refunds"
    assert aborted["partitions"] == ["refunds-0", "refunds-1"]
    assert (aborted["before"]["state"], aborted["after"]["state"]) == ("Ongoing", "Empty")
    assert _offsets(broker, "refunds") == [(2, 2), (2, 2)]


def test_an_unknown_transactional_id_is_one_line_on_stderr(broker: EmbeddedBroker) -> None:
    result = onceflow("txn", "describe", "no-such-id", "--bootstrap", broker.bootstrap_servers)
    assert result.returncode == 1
    assert result.stderr == "onceflow txn describe: unknown transactional id 'no-such-id'\n"


def _serve_a_broker_without_transaction_apis(listener: socket.socket) -> None:
    """Answers ApiVersions (listing only itself and Metadata) and Metadata, like a Kafka 2.x broker."""
    host, port = listener.getsockname()
    answers = {
        18: {
            "error_code": 0,
            "api_keys": [
                {"api_key": 3, "min_version": 0, "max_version": 12},
                {"api_key": 18, "min_version": 0, "max_version": 3},
            ],
        },
        3: {"throttle_time": 0, "brokers": [{"node_id": 0, "host": host, "port": port}], "topics": []},
    }

    def answer(client: socket.socket) -> None:
        with client:
            requests = Connection(max_request_bytes=1 << 20)
            while data := client.recv(65536):
                for event in requests.receive_data(data):
                    response = build(response_type(event.api_key, event.api_version), answers[event.api_key])
                    client.sendall(encode_response(event.correlation_id, response))

    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=answer, args=(client,), daemon=True).start()


def test_a_broker_without_the_transaction_apis_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        threading.Thread(
            target=_serve_a_broker_without_transaction_apis, args=(listener,), daemon=True
        ).start()
        host, port = listener.getsockname()
        result = onceflow("txn", "list", "--bootstrap", f"{host}:{port}")
    assert result.returncode == 1
    assert result.stderr == (
        f"onceflow txn list: the broker at {host}:{port} "
        "does not support ListTransactions (API key 66) v0-1\n"
    )
