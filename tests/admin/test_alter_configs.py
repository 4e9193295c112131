"""AlterConfigs (33) and IncrementalAlterConfigs (44) through confluent-kafka's AdminClient:
validated as at creation, applied to the live partitions, durable across a SIGKILL, and shown
by DescribeConfigs as DYNAMIC_TOPIC_CONFIG."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from onceflow import EmbeddedBroker
from tests.conftest import BrokerProcess
from tests.wire import WireClient

pytestmark = pytest.mark.timeout(60)

SET, DELETE, APPEND, SUBTRACT = (
    AlterConfigOpType.SET,
    AlterConfigOpType.DELETE,
    AlterConfigOpType.APPEND,
    AlterConfigOpType.SUBTRACT,
)


def _incremental(
    admin: AdminClient,
    topic: str,
    *changes: tuple[str, str | None, AlterConfigOpType],
    validate_only: bool = False,
    resource_type: ResourceType = ResourceType.TOPIC,
) -> None:
    entries = [ConfigEntry(name, value, incremental_operation=op) for name, value, op in changes]
    resource = ConfigResource(resource_type, topic, incremental_configs=entries)
    admin.incremental_alter_configs([resource], validate_only=validate_only, request_timeout=10)[
        resource
    ].result(10)


def _error(call: object, *args: object, **kwargs: object) -> int:
    with pytest.raises(KafkaException) as failure:
        call(*args, **kwargs)  # type: ignore[operator]
    return int(failure.value.args[0].code())


def _described(admin: AdminClient, topic: str) -> dict[str, tuple[str, int]]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource], request_timeout=10)[resource].result(10)
    return {name: (entry.value, entry.source) for name, entry in configs.items()}


DYNAMIC = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
DEFAULT = ConfigSource.DEFAULT_CONFIG.value


def _produce(bootstrap: str, topic: str, size: int) -> int | None:
    """The error code of one acks=all produce of `size` bytes, None when it was stored."""
    outcome: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 10_000})
    producer.produce(topic, b"x" * size, partition=0, on_delivery=lambda error, _: outcome.append(error))
    producer.flush(15)
    [error] = outcome
    return None if error is None else int(error.code())


def test_incremental_changes_are_applied_and_survive_sigkill(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("tuned", 1, config={"retention.ms": "3600000"})])["tuned"].result(10)
        assert _produce(broker.bootstrap_servers, "tuned", 5000) is None

        _incremental(admin, "tuned", ("max.message.bytes", "2000", SET), ("retention.ms", None, DELETE))
        assert _produce(broker.bootstrap_servers, "tuned", 5000) == KafkaError.MSG_SIZE_TOO_LARGE
        described = _described(admin, "tuned")
        assert described["max.message.bytes"] == ("2000", DYNAMIC)
        assert described["retention.ms"] == ("604800000", DEFAULT)

        broker.restart()  # SIGKILL
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        assert _described(admin, "tuned")["max.message.bytes"] == ("2000", DYNAMIC)
        assert _produce(broker.bootstrap_servers, "tuned", 5000) == KafkaError.MSG_SIZE_TOO_LARGE
    finally:
        broker.kill()


def test_segment_bytes_applies_to_the_live_partition(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "data") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("rolled", 1)])["rolled"].result(10)
        _incremental(admin, "rolled", ("segment.bytes", "400", SET))
        for _ in range(4):
            assert _produce(broker.bootstrap_servers, "rolled", 150) is None
        assert len(list((tmp_path / "data" / "rolled-0").glob("*.log"))) >= 3


def test_incremental_operations_and_errors(broker: EmbeddedBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic("ops", 1)])["ops"].result(10)
    key = "leader.replication.throttled.replicas"  # a list-typed key
    _incremental(admin, "ops", (key, "0:0", APPEND))
    _incremental(admin, "ops", (key, "1:0,0:0", APPEND))
    assert _described(admin, "ops")[key] == ("0:0,1:0", DYNAMIC)
    _incremental(admin, "ops", (key, "0:0", SUBTRACT))
    assert _described(admin, "ops")[key] == ("1:0", DYNAMIC)
    _incremental(admin, "ops", ("cleanup.policy", "delete", APPEND))  # already there: unchanged
    assert _described(admin, "ops")["cleanup.policy"] == ("delete", DYNAMIC)
    _incremental(admin, "ops", ("cleanup.policy", "compact", APPEND))
    assert _described(admin, "ops")["cleanup.policy"] == ("delete,compact", DYNAMIC)
    # Applied to the live partition: a compacted topic refuses records without a key.
    assert _produce(broker.bootstrap_servers, "ops", 10) == KafkaError.INVALID_RECORD
    # Subtracted down to nothing, as Kafka allows: neither compacted nor deleted, keys optional.
    _incremental(admin, "ops", ("cleanup.policy", "delete,compact", SUBTRACT))
    assert _described(admin, "ops")["cleanup.policy"] == ("", DYNAMIC)
    assert _produce(broker.bootstrap_servers, "ops", 10) is None

    invalid_config = KafkaError.INVALID_CONFIG
    assert _error(_incremental, admin, "ops", ("retention.ms", "1", APPEND)) == invalid_config
    assert _error(_incremental, admin, "ops", ("no.such.key", "1", SET)) == invalid_config
    assert _error(_incremental, admin, "ops", ("retention.ms", "soon", SET)) == invalid_config
    assert _error(_incremental, admin, "ops", ("min.insync.replicas", "0", SET)) == invalid_config
    assert _error(_incremental, admin, "ops", ("cleanup.policy", "shred", SET)) == invalid_config
    assert (
        _error(_incremental, admin, "missing", ("retention.ms", "1", SET)) == KafkaError.UNKNOWN_TOPIC_OR_PART
    )
    broker_resource = {"resource_type": ResourceType.BROKER}
    assert _error(_incremental, admin, "0", ("num.partitions", "3", SET), **broker_resource) == (
        KafkaError.INVALID_REQUEST
    )
    with WireClient(broker.bootstrap_servers) as client:  # a group lookup creates __consumer_offsets
        assert client.request(10, 4, key_type=0, coordinator_keys=["g"]).coordinators[0].error_code == 0
    assert _error(_incremental, admin, "__consumer_offsets", ("retention.ms", "1", SET)) == (
        KafkaError.POLICY_VIOLATION
    )
    # validate_only checks but changes nothing.
    _incremental(admin, "ops", ("retention.ms", "1000", SET), validate_only=True)
    assert _described(admin, "ops")["retention.ms"][1] == DEFAULT
    assert (
        _error(_incremental, admin, "ops", ("retention.ms", "x", SET), validate_only=True) == invalid_config
    )


def test_alter_configs_replaces_every_override(broker: EmbeddedBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    config = {"retention.ms": "3600000", "segment.bytes": "100000"}
    admin.create_topics([NewTopic("replaced", 1, config=config)])["replaced"].result(10)
    resource = ConfigResource(ResourceType.TOPIC, "replaced", set_config={"max.message.bytes": "5000"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # alter_configs is Kafka's legacy API
        admin.alter_configs([resource], request_timeout=10)[resource].result(10)
        bad = ConfigResource(ResourceType.TOPIC, "replaced", set_config={"segment.bytes": "-3"})
        assert _error(lambda: admin.alter_configs([bad], request_timeout=10)[bad].result(10)) == (
            KafkaError.INVALID_CONFIG
        )
    described = _described(admin, "replaced")
    assert described["max.message.bytes"] == ("5000", DYNAMIC)
    assert described["retention.ms"][1] == DEFAULT
    assert described["segment.bytes"] == ("1073741824", DEFAULT)
