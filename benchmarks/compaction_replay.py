"""Start-up replay of `__consumer_offsets` before and after the log cleaner compacts it.

    .venv/bin/python benchmarks/compaction_replay.py [--commits 100000] [--keys 10] [--segment-bytes 1048576]

Commits `--commits` offsets, one OffsetCommit each, spread over `--keys` (group, partition)
keys, straight into the group coordinator over its log on disk (no sockets: the figure is the
replay). Then times what a broker start spends on that log, the data directory's open plus the
coordinator's replay, before cleaning, once more after one clean, and checks that the replay
gives every key its last offset. Prints one JSON line.

The topic's `segment.bytes` is `--segment-bytes` (the broker key is
`offsets.topic.segment.bytes`; Kafka's default of 100 MiB would keep these commits, about 15 MB,
in the active segment, which is never cleaned).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from onceflow.coordinator.group import CONSUMER_OFFSETS_CONFIG, GroupCoordinator
from onceflow.coordinator.group_metadata import OffsetAndMetadata, TopicPartition
from onceflow.coordinator.group_requests import GroupConfig
from onceflow.coordinator.runtime import PartitionCoordinatorLog
from onceflow.internal_topics import CONSUMER_OFFSETS_TOPIC
from onceflow.log.cleaner import clean_log
from onceflow.log.config import LogConfig
from onceflow.log.manager import LogManager

GROUPS = 5


def _key(commit: int, keys: int) -> tuple[str, TopicPartition]:
    key = commit % keys
    return f"group-{key % GROUPS}", TopicPartition("payments", key // GROUPS)


def _open(data_dir: Path, segment_bytes: int) -> tuple[LogManager, GroupCoordinator]:
    logs = LogManager(data_dir, LogConfig(), int(time.time() * 1000))
    config = {**CONSUMER_OFFSETS_CONFIG, "segment.bytes": str(segment_bytes)}
    logs.create_topic(CONSUMER_OFFSETS_TOPIC, 1, config)
    log = PartitionCoordinatorLog(logs.get(CONSUMER_OFFSETS_TOPIC, 0))
    return logs, GroupCoordinator(log, lambda _: True, GroupConfig(), int(time.time() * 1000))


def _replay(
    data_dir: Path, args: argparse.Namespace, expected: dict[tuple[str, TopicPartition], int]
) -> dict[str, float]:
    started = time.perf_counter()
    logs, coordinator = _open(data_dir, args.segment_bytes)
    seconds = time.perf_counter() - started
    partition = logs.get(CONSUMER_OFFSETS_TOPIC, 0)
    assert partition is not None
    figures = {
        "seconds": round(seconds, 4),
        "log_bytes": partition.size_bytes,
        "segments": partition.segment_count,
    }
    for (group, topic_partition), offset in expected.items():
        (fetched,) = coordinator.fetch_offsets(group, [topic_partition], require_stable=False)
        assert fetched.offset is not None and fetched.offset.offset == offset, (group, topic_partition)
    logs.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--commits", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10, help="(group, partition) pairs")
    parser.add_argument("--segment-bytes", type=int, default=1024 * 1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onceflow-compaction-") as tmp:
        data_dir = Path(tmp)
        logs, coordinator = _open(data_dir, args.segment_bytes)
        expected = {}
        for commit in range(args.commits):
            group, partition = _key(commit, args.keys)
            coordinator.commit_offsets(group, -1, "", None, {partition: OffsetAndMetadata(commit)}, 0)
            expected[group, partition] = commit
        logs.close()
        before = _replay(data_dir, args, expected)
        logs, _ = _open(data_dir, args.segment_bytes)
        partition = logs.get(CONSUMER_OFFSETS_TOPIC, 0)
        assert partition is not None
        started = time.perf_counter()
        result = clean_log(partition, int(time.time() * 1000), force=True)
        clean_seconds = time.perf_counter() - started
        assert result is not None
        logs.close()
        after = _replay(data_dir, args, expected)
    figures = {
        "commits": args.commits,
        "keys": args.keys,
        "segment_bytes": args.segment_bytes,
        "replay_before": before,
        "clean_seconds": round(clean_seconds, 3),
        "records_removed": result.records_removed,
        "replay_after": after,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
