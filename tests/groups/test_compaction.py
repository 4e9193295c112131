"""`__consumer_offsets` is compacted: the last record of every key must be enough to rebuild the
group coordinator, transactional commits and deleted groups included."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from onceflow.coordinator.group import CONSUMER_OFFSETS_CONFIG, GroupCoordinator
from onceflow.coordinator.group_metadata import OffsetAndMetadata, TopicPartition
from onceflow.coordinator.group_requests import GroupConfig
from onceflow.coordinator.runtime import PartitionCoordinatorLog
from onceflow.internal_topics import CONSUMER_OFFSETS_TOPIC
from onceflow.log.cleaner import clean_log
from onceflow.log.config import LogConfig
from onceflow.log.manager import LogManager
from tests.conftest import BrokerProcess

P0, P1 = TopicPartition("t", 0), TopicPartition("t", 1)
PARTITIONS = {P0, P1}.__contains__


def test_a_compacted_offsets_log_replays_to_the_same_offsets(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, LogConfig(), 0)
    config = {**CONSUMER_OFFSETS_CONFIG, "segment.bytes": "400", "delete.retention.ms": "0"}
    logs.create_topic(CONSUMER_OFFSETS_TOPIC, 1, config)
    coordinator_log = PartitionCoordinatorLog(logs.get(CONSUMER_OFFSETS_TOPIC, 0))
    live = GroupCoordinator(coordinator_log, PARTITIONS, GroupConfig(), 0)
    live.commit_offsets("kept", -1, "", None, {P0: OffsetAndMetadata(3)}, 10)
    # Producer 9 commits offset 8, then aborts its next transaction: only that last
    # transaction's end survives compaction, so the commit must stand on its own.
    live.commit_transactional_offsets("kept", 9, 0, -1, "", None, {P0: OffsetAndMetadata(8)}, 11)
    live.complete_transaction(9, 0, commit=True, coordinator_epoch=0, now_ms=12)
    live.commit_transactional_offsets("kept", 9, 0, -1, "", None, {P1: OffsetAndMetadata(20)}, 13)
    live.complete_transaction(9, 0, commit=False, coordinator_epoch=0, now_ms=14)
    live.commit_transactional_offsets("open", 11, 0, -1, "", None, {P0: OffsetAndMetadata(6)}, 15)
    # A deleted group must not come back once compaction drops its tombstone.
    live.commit_offsets("deleted", -1, "", None, {P0: OffsetAndMetadata(4)}, 16)
    assert live.delete_groups(["deleted"], 17) == {"deleted": ErrorCode.none}
    partition_log = coordinator_log.partition_log
    commits = 0
    while partition_log.segment_count < 4:
        commits += 1
        live.commit_offsets("busy", -1, "", None, {P0: OffsetAndMetadata(commits)}, 18)
    partition_log.flush()
    size = partition_log.size_bytes

    assert clean_log(partition_log, 10_000, force=True) is not None
    assert partition_log.size_bytes < size
    replayed = GroupCoordinator(coordinator_log, PARTITIONS, GroupConfig(), 20)
    for group in ("kept", "open", "deleted", "busy"):
        assert replayed.fetch_offsets(group, None, require_stable=True) == live.fetch_offsets(
            group, None, require_stable=True
        )
    assert replayed.fetch_offsets("kept", [P0, P1], False)[0].offset == OffsetAndMetadata(8)
    assert replayed.describe_group("deleted") is None
    assert [staged.group_id for staged in replayed.staged_offsets(11)] == ["open"]
    assert replayed.staged_offsets(9) == []
    logs.close()


def test_the_broker_compacts_its_offsets_topic_and_restarts_with_the_last_commits(tmp_path: Path) -> None:
    settings = {"log.cleaner.backoff.ms": "50", "offsets.topic.segment.bytes": "2048"}
    process = BrokerProcess(tmp_path / "data", settings=settings).start()
    try:
        bootstrap = {"bootstrap.servers": process.bootstrap_servers}
        admin = AdminClient(bootstrap)
        admin.create_topics([NewTopic("t", 2, 1)])["t"].result(timeout=30)
        consumer = Consumer({**bootstrap, "group.id": "g", "enable.auto.commit": False})
        for offset in range(1, 201):
            consumer.commit(offsets=[KafkaPartition("t", offset % 2, offset)], asynchronous=False)
        consumer.close()
        directory = tmp_path / "data" / f"{CONSUMER_OFFSETS_TOPIC}-0"

        def log_bytes() -> int:
            return sum(path.stat().st_size for path in directory.glob("*.log"))

        # 200 commits take about 30 KB; compacted, the active segment and a few records remain.
        compacted = 3 * 2048
        deadline = time.monotonic() + 30
        while log_bytes() > compacted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log_bytes() <= compacted
        process.restart()
        consumer = Consumer({**bootstrap, "group.id": "g"})
        committed = consumer.committed([KafkaPartition("t", 0), KafkaPartition("t", 1)], timeout=30)
        assert [partition.offset for partition in committed] == [200, 199]
        consumer.close()
    finally:
        process.kill()
