"""`onceflow groups ...` against consumer groups that real confluent-kafka consumers made."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker
from tests.cli.commands import admin, admin_json, onceflow
from tests.conftest import FAST_JOINS

pytestmark = pytest.mark.timeout(60)

TOPIC = "clicks"
PER_PARTITION = 10


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(config=FAST_JOINS) as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(timeout=30)
        producer = Producer({"bootstrap.servers": running.bootstrap_servers})
        for index in range(PER_PARTITION):
            for partition in (0, 1):
                producer.produce(TOPIC, f"click-{index}".encode(), partition=partition)
        assert producer.flush(10) == 0
        yield running


def _consumer(broker: EmbeddedBroker, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def _commit(broker: EmbeddedBroker, group: str, offsets: dict[int, int]) -> None:
    """Commit as a consumer that never joins, which leaves the group inactive (Empty)."""
    consumer = _consumer(broker, group)
    consumer.commit(
        offsets=[TopicPartition(TOPIC, partition, offset) for partition, offset in offsets.items()],
        asynchronous=False,
    )
    consumer.close()


def _committed(rows: list[dict[str, Any]]) -> dict[int, int | None]:
    return {row["partition"]: row["committed_offset"] for row in rows}


def test_list_describe_and_reset_an_inactive_group(broker: EmbeddedBroker) -> None:
    _commit(broker, "reporting", {0: 4, 1: 6})

    assert any(
        line.split()[:2] == ["reporting", "Empty"] for line in admin(broker, "groups", "list").splitlines()
    )
    assert {"group": "reporting", "state": "Empty", "simple": True} in admin_json(broker, "groups", "list")

    described = admin(broker, "groups", "describe", "reporting")
    assert "no active members" in described
    group = admin_json(broker, "groups", "describe", "reporting")
    assert group["state"] == "Empty"
    assert group["members"] == []
    assert [(row["committed_offset"], row["end_offset"], row["lag"]) for row in group["offsets"]] == [
        (4, PER_PARTITION, 6),
        (6, PER_PARTITION, 4),
    ]

    reset = admin(broker, "groups", "reset-offsets", "reporting", "--to-offset", "7")
    assert [line.split() for line in reset.splitlines() if line.startswith(TOPIC)] == [
        [TOPIC, "0", "4", "7"],
        [TOPIC, "1", "6", "7"],
    ]
    # An offset beyond the log is moved to its end, as Kafka's tool does.
    beyond = admin_json(broker, "groups", "reset-offsets", "reporting", "--to-offset", "999")
    assert [(row["before"], row["after"]) for row in beyond["offsets"]] == [(7, 10), (7, 10)]
    dry_run = admin_json(broker, "groups", "reset-offsets", "reporting", "--to-earliest", "--dry-run")
    assert [(row["before"], row["after"]) for row in dry_run["offsets"]] == [(10, 0), (10, 0)]
    earliest = admin_json(broker, "groups", "reset-offsets", "reporting", "--to-earliest")  # still from 10
    assert [(row["before"], row["after"]) for row in earliest["offsets"]] == [(10, 0), (10, 0)]
    assert _committed(admin_json(broker, "groups", "describe", "reporting")["offsets"]) == {0: 0, 1: 0}

    # A group with no commits yet gets offsets for the partitions of --topic.
    fresh = admin_json(broker, "groups", "reset-offsets", "fresh", "--to-latest", "--topic", TOPIC)
    assert [(row["before"], row["after"]) for row in fresh["offsets"]] == [(None, 10), (None, 10)]


def test_reset_is_refused_while_the_group_has_members(broker: EmbeddedBroker) -> None:
    _commit(broker, "live", {0: 2, 1: 2})
    consumer = _consumer(broker, "live")
    consumer.subscribe([TOPIC])
    try:
        deadline = time.monotonic() + 20
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the consumer never joined"
            consumer.poll(0.1)

        group = admin_json(broker, "groups", "describe", "live")
        assert group["state"] == "Stable"
        [member] = group["members"]
        assert sorted(member["partitions"]) == [f"{TOPIC}-0", f"{TOPIC}-1"]

        refused = onceflow(
            "groups", "reset-offsets", "live", "--to-earliest", "--bootstrap", broker.bootstrap_servers
        )
        assert refused.returncode == 1
        assert "'live' has 1 active member(s)" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        consumer.close()
    assert _committed(admin_json(broker, "groups", "describe", "live")["offsets"]) == {0: 2, 1: 2}


def test_an_unknown_group_is_one_line_on_stderr(broker: EmbeddedBroker) -> None:
    result = onceflow("groups", "describe", "no-such-group", "--bootstrap", broker.bootstrap_servers)
    assert result.returncode == 1
    assert result.stderr == "onceflow groups describe: unknown group 'no-such-group'\n"


def test_delete_offsets(broker: EmbeddedBroker) -> None:
    committer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "pruned"})
    committer.commit(offsets=[TopicPartition(TOPIC, 0, 4), TopicPartition(TOPIC, 1, 6)], asynchronous=False)
    committer.close()

    deleted = admin(broker, "groups", "delete-offsets", "pruned", "--topic", TOPIC, "--partition", "0")
    assert f"deleted the offsets of 1 partition(s) of '{TOPIC}' in group 'pruned'" in deleted
    offsets = {
        row["partition"]: row["committed_offset"]
        for row in admin_json(broker, "groups", "describe", "pruned")["offsets"]
    }
    assert offsets == {1: 6}

    unknown = onceflow(
        "groups", "delete-offsets", "nobody", "--topic", TOPIC, "--bootstrap", broker.bootstrap_servers
    )
    assert unknown.returncode == 1
    assert unknown.stderr == "onceflow groups delete-offsets: group 'nobody': GROUP_ID_NOT_FOUND\n"
    missing = onceflow(
        "groups", "delete-offsets", "pruned", "--topic", "nope", "--bootstrap", broker.bootstrap_servers
    )
    assert missing.returncode == 1
    assert missing.stderr == "onceflow groups delete-offsets: unknown topic 'nope'\n"
