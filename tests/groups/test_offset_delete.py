"""OffsetDelete (47) through kafka-python's KafkaAdminClient: Kafka's group rules, and deletions
that the coordinator's log keeps across a SIGKILL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError, NonEmptyGroupError

from onceflow import EmbeddedBroker
from tests.conftest import BrokerProcess, wait_until
from tests.groups.helpers import join
from tests.wire import WireClient

pytestmark = pytest.mark.timeout(60)


def _create(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1) for topic in topics]).values():
        future.result(10)


def _commit_without_joining(bootstrap: str, group: str, offsets: dict[str, int]) -> None:
    """Commit as a consumer that assigns its partitions itself (the group stays Empty)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(
            offsets=[ConfluentPartition(topic, 0, offset) for topic, offset in offsets.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()


def _committed(admin: KafkaAdminClient, group: str) -> dict[str, int]:
    return {
        tp.topic: meta.offset
        for tp, meta in admin.list_group_offsets(group)[group].items()
        if meta.offset >= 0
    }


@pytest.fixture
def kafka_admin(broker: EmbeddedBroker) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    yield admin
    admin.close()


def test_offsets_of_an_empty_group_are_deleted(broker: EmbeddedBroker, kafka_admin: KafkaAdminClient) -> None:
    _create(broker.bootstrap_servers, "orders", "refunds")
    _commit_without_joining(broker.bootstrap_servers, "billing", {"orders": 5, "refunds": 7})
    errors = kafka_admin.delete_group_offsets("billing", [TopicPartition("orders", 0)])
    assert errors == {TopicPartition("orders", 0): NoError}
    assert _committed(kafka_admin, "billing") == {"refunds": 7}
    # The last offset gone, the empty group is gone too (Kafka's Dead).
    kafka_admin.delete_group_offsets("billing", [TopicPartition("refunds", 0)])
    assert "billing" not in {listing[0] for listing in kafka_admin.list_groups()}
    with pytest.raises(GroupIdNotFoundError):
        kafka_admin.delete_group_offsets("billing", [TopicPartition("orders", 0)])


def test_an_active_group_keeps_the_offsets_of_its_subscribed_topics(
    broker: EmbeddedBroker, kafka_admin: KafkaAdminClient
) -> None:
    _create(broker.bootstrap_servers, "subscribed", "elsewhere")
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "live", "enable.auto.commit": False}
    )
    try:
        consumer.subscribe(["subscribed"])
        wait_until(lambda: consumer.poll(0.1) is None and bool(consumer.assignment()), timeout_s=20)
        consumer.commit(
            offsets=[ConfluentPartition("subscribed", 0, 3), ConfluentPartition("elsewhere", 0, 4)],
            asynchronous=False,
        )
        errors = kafka_admin.delete_group_offsets(
            "live", [TopicPartition("subscribed", 0), TopicPartition("elsewhere", 0)]
        )
        assert errors == {
            TopicPartition("subscribed", 0): GroupSubscribedToTopicError,
            TopicPartition("elsewhere", 0): NoError,
        }
        assert _committed(kafka_admin, "live") == {"subscribed": 3}
    finally:
        consumer.close()


def test_an_active_group_of_another_protocol_type_is_non_empty(
    broker: EmbeddedBroker, kafka_admin: KafkaAdminClient
) -> None:
    _create(broker.bootstrap_servers, "configs")
    _commit_without_joining(broker.bootstrap_servers, "workers", {"configs": 1})
    with WireClient(broker.bootstrap_servers) as wire:
        joined = join(wire, "workers", version=3, protocol_type="connect", protocols=(("default", b""),))
        assert joined.error_code == 0
        with pytest.raises(NonEmptyGroupError):
            kafka_admin.delete_group_offsets("workers", [TopicPartition("configs", 0)])


def test_deleted_offsets_stay_deleted_after_sigkill(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        _create(broker.bootstrap_servers, "ledger", "audit")
        _commit_without_joining(broker.bootstrap_servers, "accounts", {"ledger": 9, "audit": 2})
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        admin.delete_group_offsets("accounts", [TopicPartition("ledger", 0)])
        admin.close()
        broker.restart()  # SIGKILL: the tombstone must already be in the coordinator's log
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        assert _committed(admin, "accounts") == {"audit": 2}
        admin.close()
    finally:
        broker.kill()
