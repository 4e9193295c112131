"""Behaviour that real clients' own test suites rely on, checked through those clients."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from tests.wire import WireClient


def _create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)


def test_fetch_out_of_range_applies_auto_offset_reset(broker: EmbeddedBroker) -> None:
    """librdkafka must read OFFSET_OUT_OF_RANGE from the reply to reset to the earliest offset."""
    _create(broker.bootstrap_servers, "reset")
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce("reset", value=b"only")
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": "reset",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition("reset", 0, 1000)])
        deadline = time.monotonic() + 20
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.2)
        assert message is not None, "the consumer never reset its offset"
        assert message.error() is None and (message.offset(), message.value()) == (0, b"only")
    finally:
        consumer.close()


@pytest.mark.parametrize("version", [4, 12])
def test_every_fetch_error_carries_empty_records(broker: EmbeddedBroker, version: int) -> None:
    """Kafka answers an errored partition with empty records, never null (librdkafka needs them)."""
    _create(broker.bootstrap_servers, "errors")
    wanted = {"errors": [0, 7], "no-such-topic": [0]}
    with WireClient(broker.bootstrap_servers) as wire:
        response = wire.request(
            1,
            version,
            replica_id=-1,
            max_wait=0,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "current_leader_epoch": -1,
                            "fetch_offset": 1000,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                        }
                        for partition in partitions
                    ],
                }
                for topic, partitions in wanted.items()
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
    answers = {
        (topic.topic, partition.partition_index): (partition.error_code, partition.records)
        for topic in response.responses
        for partition in topic.partitions
    }
    assert answers == {
        ("errors", 0): (ErrorCode.offset_out_of_range, b""),
        ("errors", 7): (ErrorCode.unknown_topic_or_partition, b""),
        ("no-such-topic", 0): (ErrorCode.unknown_topic_or_partition, b""),
    }


def test_a_new_group_waits_for_its_members_before_the_first_assignment(tmp_path: Path) -> None:
    """Kafka's group.initial.rebalance.delay.ms (3 s): consumers that join a new group together
    share its first assignment, and the first one is not handed every partition and then revoked."""
    with EmbeddedBroker(tmp_path / "data") as broker:  # the product defaults
        _create(broker.bootstrap_servers, "shared", partitions=4)
        events: dict[str, list[tuple[str, list[int]]]] = {"a": [], "b": []}

        def consumer(name: str) -> Consumer:
            member = Consumer(
                {
                    "bootstrap.servers": broker.bootstrap_servers,
                    "group.id": "together",
                    "partition.assignment.strategy": "range",
                    "enable.auto.commit": False,
                }
            )
            member.subscribe(
                ["shared"],
                on_assign=lambda _, tps: events[name].append(("assign", [tp.partition for tp in tps])),
                on_revoke=lambda _, tps: events[name].append(("revoke", [tp.partition for tp in tps])),
            )
            return member

        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        first = consumer("a")
        members = [first]
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (events["a"] and events["b"]):
                for member in members:
                    member.poll(0.05)
                if len(members) == 1:
                    groups = admin.describe_consumer_groups(["together"])["together"].result(timeout=10)
                    if groups.members or str(groups.state) != "ConsumerGroupState.DEAD":
                        members.append(consumer("b"))  # the group exists: the second one joins
            assert [kind for kind, _ in events["a"]] == ["assign"] and len(events["b"]) == 1
            shares = [set(events[name][0][1]) for name in "ab"]
            assert shares[0] and shares[1] and shares[0] | shares[1] == {0, 1, 2, 3}
        finally:
            for member in members:
                member.close()


def test_metadata_reports_every_operation_as_allowed_when_asked(broker: EmbeddedBroker) -> None:
    """Kafka without an authorizer allows every operation of the resource type (librdkafka's
    describe_topics and describe_cluster read them from Metadata), and sends INT32_MIN (no
    operations listed) when they were not asked for."""
    _create(broker.bootstrap_servers, "described")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    topics = TopicCollection(["described"])
    topic = admin.describe_topics(topics, include_authorized_operations=True)["described"].result(timeout=30)
    assert set(topic.authorized_operations) == {
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }
    assert admin.describe_topics(topics)["described"].result(timeout=30).authorized_operations is None
    cluster = admin.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    }
    assert admin.describe_cluster().result(timeout=30).authorized_operations is None
