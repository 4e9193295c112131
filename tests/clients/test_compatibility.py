"""Behaviour that real clients' own test suites rely on, checked through those clients."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.admin import NewTopic as NewKafkaTopic
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
        response = wire.fetch(wanted, version, fetch_offset=1000)
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


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"dummy.doesntexist": "1"}, "Unknown topic config name: dummy.doesntexist"),
        ({"retention.ms": "soon"}, "Not a number of type LONG"),
        ({"min.insync.replicas": "0"}, "at least 1"),
        ({"cleanup.policy": "tidy"}, "String must be one of"),
        ({"preallocate": "maybe"}, "either true or false"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "no more than 1"),
        ({"message.timestamp.type": "LogAppendTime"}, "does not support LogAppendTime"),
        ({"segment.ms": "0"}, "Value must be at least 1"),
        ({"retention.msec": "1"}, "did you mean retention.ms?"),
    ],
)
def test_create_topics_refuses_configs_it_does_not_know_or_apply(
    broker: EmbeddedBroker, config: dict[str, str], message: str
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    future = admin.create_topics([NewTopic("configured", 1, 1, config=config)])["configured"]
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=30)
    error = raised.value.args[0]
    assert error.code() == KafkaError.INVALID_CONFIG and message in error.str()
    assert "configured" not in admin.list_topics(timeout=30).topics


def test_create_topics_accepts_the_keys_it_applies_and_kafkas_defaults(broker: EmbeddedBroker) -> None:
    config = {
        "retention.ms": "3600000",
        "segment.bytes": "1048576",
        "cleanup.policy": "delete",
        "compression.type": "producer",
        "message.timestamp.type": "CreateTime",
        "unclean.leader.election.enable": "true",
        "min.cleanable.dirty.ratio": "0.1",
        "segment.ms": "60000",
        "segment.jitter.ms": "1000",
    }
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic("accepted", 1, 1, config=config)])["accepted"].result(timeout=30)


def test_describe_configs_reports_stored_and_default_configs_with_types(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "data", config={"log.retention.hours": "24"}) as broker:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        try:
            admin.create_topics(
                [
                    NewKafkaTopic(
                        "described", 1, 1, topic_configs={"retention.bytes": "5000", "preallocate": "true"}
                    )
                ]
            )
            topic = ConfigResource(ConfigResourceType.TOPIC, "described")
            described = admin.describe_configs([topic], include_synonyms=True, config_filter="all")
            configs = described["topic"]["described"]
            brokers = admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all"
            )
            broker_configs = brokers["broker"]["0"]
        finally:
            admin.close()
    seen = {name: (c["value"], c["config_source"], c["config_type"]) for name, c in configs.items()}
    assert seen["retention.bytes"] == ("5000", "DYNAMIC_TOPIC_CONFIG", "LONG")
    assert seen["preallocate"] == ("true", "DYNAMIC_TOPIC_CONFIG", "BOOLEAN")
    assert seen["retention.ms"] == ("86400000", "STATIC_BROKER_CONFIG", "LONG")
    assert seen["segment.bytes"] == ("1073741824", "DEFAULT_CONFIG", "INT")
    assert seen["cleanup.policy"] == ("delete", "DEFAULT_CONFIG", "LIST")
    assert seen["compression.type"] == ("producer", "DEFAULT_CONFIG", "STRING")
    assert seen["min.cleanable.dirty.ratio"] == ("0.5", "DEFAULT_CONFIG", "DOUBLE")
    assert all(not c["read_only"] and not c["is_sensitive"] for c in configs.values())
    assert [(s["name"], s["value"], s["source"]) for s in configs["retention.ms"]["synonyms"]] == [
        ("log.retention.hours", "24", "STATIC_BROKER_CONFIG"),
        ("log.retention.hours", "168", "DEFAULT_CONFIG"),
    ]
    assert [(s["name"], s["source"]) for s in configs["retention.bytes"]["synonyms"]] == [
        ("retention.bytes", "DYNAMIC_TOPIC_CONFIG"),
        ("log.retention.bytes", "DEFAULT_CONFIG"),
    ]
    assert broker_configs["log.retention.hours"]["value"] == "24"
    assert broker_configs["log.retention.hours"]["config_source"] == "STATIC_BROKER_CONFIG"
    assert broker_configs["group.initial.rebalance.delay.ms"]["config_type"] == "INT"
    assert broker_configs["auto.create.topics.enable"]["config_type"] == "BOOLEAN"
    assert broker_configs["num.partitions"]["config_source"] == "DEFAULT_CONFIG"


def test_describe_cluster_answers_admin_clients(broker: EmbeddedBroker) -> None:
    """kafka-python asks DescribeCluster (60) first and falls back to Metadata only when the API is
    missing; Metadata v11+ has no cluster operations, so only DescribeCluster carries them."""
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert cluster["cluster_id"] == "onceflow-cluster" and cluster["controller_id"] == 0
    assert [(b["broker_id"], b["port"]) for b in cluster["brokers"]] == [(0, broker.port)]
    assert set(cluster["authorized_operations"]) == {
        "CREATE",
        "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "IDEMPOTENT_WRITE",
        "ALTER",
        "DESCRIBE",
    }


@pytest.mark.parametrize(
    ("endpoint_type", "error"),
    [(2, ErrorCode.mismatched_endpoint_type), (3, ErrorCode.unsupported_endpoint_type)],
)
def test_describe_cluster_for_other_endpoint_types(
    broker: EmbeddedBroker, endpoint_type: int, error: ErrorCode
) -> None:
    with WireClient(broker.bootstrap_servers) as wire:
        response = wire.request(
            60,
            2,
            include_cluster_authorized_operations=False,
            endpoint_type=endpoint_type,
            include_fenced_brokers=False,
        )
    assert response.error_code == error and response.brokers == ()
