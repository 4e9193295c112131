"""Committed offsets, staged transactional offsets and group metadata survive SIGKILL."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import OffsetAndMetadata
from onceflow.coordinator.group_metadata import TopicPartition as Partition
from onceflow.coordinator.group_requests import GroupConfig
from tests.conftest import BrokerProcess
from tests.groups.helpers import begin_offsets_transaction, commit, describe, fetch, heartbeat, txn_commit
from tests.memory_coordinator_log import MemoryLog
from tests.wire import WireClient

TOPIC = "durable"


def test_offsets_and_groups_survive_a_broker_crash(tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path / "data", settings={"group.min.session.timeout.ms": "1000"}).start()
    try:
        bootstrap = {"bootstrap.servers": process.bootstrap_servers}
        admin = AdminClient(bootstrap)
        admin.create_topics([NewTopic(TOPIC, 3, 1)])[TOPIC].result(timeout=30)
        producer = Producer(bootstrap)
        for number in range(90):  # every partition gets records, so each has a committed offset
            producer.produce(TOPIC, value=str(number), partition=number % 3)
        assert producer.flush(30) == 0
        consumer = Consumer(
            {
                **bootstrap,
                "group.id": "survivors",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "heartbeat.interval.ms": 100,
                "session.timeout.ms": 30_000,
            }
        )
        consumer.subscribe([TOPIC])
        consumed = 0
        deadline = time.monotonic() + 30
        while consumed < 90:
            assert time.monotonic() < deadline
            messages = consumer.consume(100, timeout=0.2)
            consumed += len(messages)
            if messages:
                consumer.commit(asynchronous=False)  # answered only once durable
        committed = consumer.committed([TopicPartition(TOPIC, p) for p in range(3)], timeout=10)
        with WireClient(process.bootstrap_servers) as client:
            producer = begin_offsets_transaction(client, "in-flight-txn", "in-flight")
            assert txn_commit(client, "in-flight", producer, {(TOPIC, 0): 12}) == {(TOPIC, 0): ErrorCode.none}
            assert commit(client, "simple", {(TOPIC, 1): 5}) == {(TOPIC, 1): ErrorCode.none}
            before = describe(client, "survivors")

        process.restart()  # SIGKILL, then start on the same port
        with WireClient(process.bootstrap_servers) as client:
            after = describe(client, "survivors")
            assert (after.group_state, after.protocol_data) == ("Stable", before.protocol_data)
            assert [(m.member_id, m.member_assignment) for m in after.members] == [
                (m.member_id, m.member_assignment) for m in before.members
            ]
            partitions = [(TOPIC, p) for p in range(3)]
            assert fetch(client, "survivors", partitions) == {
                (TOPIC, tp.partition): (tp.offset, ErrorCode.none) for tp in committed
            }
            assert sum(tp.offset for tp in committed) == 90
            assert fetch(client, "in-flight", [(TOPIC, 0)], require_stable=True) == {
                (TOPIC, 0): (-1, ErrorCode.unstable_offset_commit)
            }
            assert fetch(client, "simple", [(TOPIC, 1)]) == {(TOPIC, 1): (5, ErrorCode.none)}
        # The consumer lived through the restart: same member, same generation, no rebalance.
        member_id = consumer.memberid()
        assert member_id == before.members[0].member_id
        with WireClient(process.bootstrap_servers) as client:
            generations = [
                g for g in range(1, 20) if heartbeat(client, "survivors", g, member_id) == ErrorCode.none
            ]
        assert len(generations) == 1
        consumer.close()
    finally:
        process.kill()


def test_replay_rebuilds_the_coordinator() -> None:
    """Every kind of record, replayed by a fresh coordinator over the same log."""
    partition = Partition(TOPIC, 0)
    log = MemoryLog()
    live = GroupCoordinator(log, {partition}.__contains__, GroupConfig(), 0)
    live.commit_offsets("kept", -1, "", None, {partition: OffsetAndMetadata(3, 1, "m", 10)}, 10)
    live.commit_offsets("deleted", -1, "", None, {partition: OffsetAndMetadata(4)}, 10)
    live.commit_transactional_offsets("kept", 9, 0, -1, "", None, {partition: OffsetAndMetadata(8)}, 11)
    live.commit_transactional_offsets("deleted", 9, 0, -1, "", None, {partition: OffsetAndMetadata(8)}, 11)
    live.commit_transactional_offsets("aborted", 10, 2, -1, "", None, {partition: OffsetAndMetadata(5)}, 12)
    live.commit_transactional_offsets("open", 11, 0, -1, "", None, {partition: OffsetAndMetadata(6)}, 12)
    assert live.delete_groups(["deleted"], 13) == {"deleted": ErrorCode.none}
    assert live.complete_transaction(9, 0, commit=True, coordinator_epoch=0, now_ms=14) == [live.log]
    assert live.complete_transaction(10, 2, commit=False, coordinator_epoch=0, now_ms=14) == [live.log]
    # Nothing staged, and a coordinator epoch already known: nothing to write.
    assert live.complete_transaction(9, 0, commit=True, coordinator_epoch=0, now_ms=14) == []

    replayed = GroupCoordinator(log, {partition}.__contains__, GroupConfig(), 20)
    for group in ("kept", "deleted", "aborted", "open"):
        assert replayed.fetch_offsets(group, [partition], require_stable=True) == live.fetch_offsets(
            group, [partition], require_stable=True
        )
        assert replayed.describe_group(group) == live.describe_group(group)
    assert replayed.fetch_offsets("kept", None, False)[0].offset == OffsetAndMetadata(8)
    assert replayed.has_pending_offsets("open", TOPIC, 0)
    assert [s.group_id for s in replayed.staged_offsets(11)] == ["open"]
    assert replayed.staged_offsets(9) == replayed.staged_offsets(10) == []
