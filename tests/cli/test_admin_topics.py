"""`onceflow topics ...` as an operator runs it: a real process against a broker on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from onceflow import EmbeddedBroker
from tests.cli.commands import admin, admin_json, onceflow

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


def test_create_list_describe_delete(broker: EmbeddedBroker) -> None:
    created = admin(
        broker, "topics", "create", "orders", "--partitions", "3", "--config", "retention.ms=3600000"
    )
    assert "created topic 'orders'" in created
    assert "retention.ms=3600000" in created
    assert admin_json(broker, "topics", "create", "defaulted")["partitions"] == 1  # num.partitions
    again = onceflow("topics", "create", "orders", "--bootstrap", broker.bootstrap_servers)
    assert again.returncode == 1
    assert "already exists" in again.stderr

    listed = admin(broker, "topics", "list")
    assert any(line.split()[:2] == ["orders", "3"] for line in listed.splitlines())
    rows = {row["topic"]: row for row in admin_json(broker, "topics", "list")}
    assert rows["orders"] == {"topic": "orders", "partitions": 3, "internal": False}
    assert "defaulted" in rows

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for index in range(5):
        producer.produce("orders", f"order-{index}".encode(), partition=1)
    assert producer.flush(10) == 0

    described = admin(broker, "topics", "describe", "orders")
    assert "topic orders" in described
    assert "LSO" in described
    [topic] = admin_json(broker, "topics", "describe", "orders")
    offsets = {
        p["partition"]: (p["start_offset"], p["end_offset"], p["last_stable_offset"])
        for p in topic["partitions"]
    }
    assert offsets == {0: (0, 0, 0), 1: (0, 5, 5), 2: (0, 0, 0)}
    assert topic["partitions"][0]["leader"] == 0
    assert (topic["partitions"][0]["leader_epoch"], topic["partitions"][0]["isr"]) == (0, [0])
    assert topic["configs"] == {"retention.ms": "3600000"}  # its own, not the defaults
    assert "configs: retention.ms=3600000" in described

    assert "deleted topic 'defaulted'" in admin(broker, "topics", "delete", "defaulted")
    assert "defaulted" not in {row["topic"] for row in admin_json(broker, "topics", "list")}


def test_an_unknown_topic_is_one_line_on_stderr(broker: EmbeddedBroker) -> None:
    result = onceflow("topics", "describe", "no-such-topic", "--bootstrap", broker.bootstrap_servers)
    assert result.returncode == 1
    assert result.stderr == "onceflow topics describe: unknown topic 'no-such-topic'\n"
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("factor", "problem"), [("0", "must be at least 1 (or -1 for the default)"), ("2", "is larger than")]
)
def test_a_replication_factor_one_broker_cannot_have_says_why(
    broker: EmbeddedBroker, factor: str, problem: str
) -> None:
    arguments = ["topics", "create", "copies", "--replication-factor", factor]
    result = onceflow(*arguments, "--bootstrap", broker.bootstrap_servers)
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"onceflow topics create: cannot create topic 'copies': replication factor {factor} {problem}"
    )


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("args", [["topics", "describe", "t"], ["txn", "list"]])  # AdminClient, wire client
def test_an_unreachable_broker_is_reported(args: list[str]) -> None:
    result = onceflow(*args, "--bootstrap", f"127.0.0.1:{_closed_port()}", "--timeout", "2")
    assert result.returncode == 1
    assert "cannot reach a broker at 127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["topics", "list", "--bootstrap", "no-port"],
        ["groups", "reset-offsets", "g", "--to-earliest", "--to-latest"],
        ["txn", "abort", "some-id", "--topic", "t"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = onceflow(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr


def test_alter_config_and_delete_records(broker: EmbeddedBroker) -> None:
    admin(broker, "topics", "create", "tuned", "--partitions", "2", "--config", "retention.ms=3600000")
    altered = admin_json(
        broker,
        "topics",
        "alter-config",
        "tuned",
        "--set",
        "max.message.bytes=5000",
        "--delete",
        "retention.ms",
    )
    assert altered == {"topic": "tuned", "configs": {"max.message.bytes": "5000"}}
    refused = onceflow(
        "topics",
        "alter-config",
        "tuned",
        "--set",
        "retention.ms=soon",
        "--bootstrap",
        broker.bootstrap_servers,
    )
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("onceflow topics alter-config: cannot alter the configs of 'tuned': ")
    assert "retention.ms" in refused.stderr

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})
    for index in range(8):
        producer.produce("tuned", f"r{index}".encode(), partition=0)
    assert producer.flush(10) == 0
    trimmed = admin_json(broker, "topics", "delete-records", "tuned", "--partition", "0", "--before", "5")
    assert trimmed == [{"topic": "tuned", "partition": 0, "low_watermark": 5}]
    beyond = onceflow(
        "topics",
        "delete-records",
        "tuned",
        "--partition",
        "0",
        "--before",
        "99",
        "--bootstrap",
        broker.bootstrap_servers,
    )
    assert beyond.returncode == 1
    assert beyond.stderr.count("\n") == 1
    assert "Offset out of range" in beyond.stderr
    unknown = onceflow(
        "topics", "delete-records", "nope", "--before", "1", "--bootstrap", broker.bootstrap_servers
    )
    assert unknown.stderr == "onceflow topics delete-records: unknown topic 'nope'\n"
