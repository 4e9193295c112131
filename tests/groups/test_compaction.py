"""`__consumer_offsets` is compacted: the last record of every key must be enough to rebuild the
group coordinator, transactional commits and deleted groups included."""

from __future__ import annotations

from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.coordinator.group import (
    CONSUMER_OFFSETS_CONFIG,
    CONSUMER_OFFSETS_TOPIC,
    GroupConfig,
    GroupCoordinator,
)
from onceflow.coordinator.group_metadata import OffsetAndMetadata, TopicPartition
from onceflow.coordinator.runtime import PartitionCoordinatorLog
from onceflow.log.cleaner import clean_log
from onceflow.log.config import LogConfig
from onceflow.log.manager import LogManager

P0, P1 = TopicPartition("t", 0), TopicPartition("t", 1)
PARTITIONS = {P0, P1}.__contains__


def test_a_compacted_offsets_log_replays_to_the_same_offsets(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, LogConfig(), 0)
    config = {**CONSUMER_OFFSETS_CONFIG, "segment.bytes": "400", "delete.retention.ms": "0"}
    coordinator_log = PartitionCoordinatorLog.open(logs, CONSUMER_OFFSETS_TOPIC, config)
    live = GroupCoordinator(coordinator_log, PARTITIONS, GroupConfig(), 0)
    live.commit_offsets("kept", -1, "", None, {P0: OffsetAndMetadata(3)}, 10)
    # Producer 9 commits offset 8, then aborts its next transaction: only that last
    # transaction's end survives compaction, so the commit must stand on its own.
    live.commit_transactional_offsets("kept", 9, 0, -1, "", None, {P0: OffsetAndMetadata(8)}, 11)
    live.complete_transaction(9, commit=True, now_ms=12)
    live.commit_transactional_offsets("kept", 9, 0, -1, "", None, {P1: OffsetAndMetadata(20)}, 13)
    live.complete_transaction(9, commit=False, now_ms=14)
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
