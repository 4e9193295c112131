from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from onceflow.log.config import LogConfig
from onceflow.log.errors import (
    DataDirLockedError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    TopicExistsError,
    UnknownTopicError,
)
from onceflow.log.manager import LogManager
from tests.log.batches import make_batch
from tests.log.helpers import append, read_all

BROKER = LogConfig(segment_bytes=10_000, retention_ms=-1)


@pytest.fixture
def manager(tmp_path: Path):  # type: ignore[no-untyped-def]
    opened = LogManager(tmp_path, BROKER, now_ms=0)
    yield opened
    opened.close()


def test_create_topic_lays_out_kafka_style_directories(tmp_path: Path, manager: LogManager) -> None:
    info = manager.create_topic("orders.v1", 3, {"segment.bytes": "500", "cleanup.policy": "delete"})
    assert sorted(path.name for path in tmp_path.iterdir() if path.is_dir()) == [
        "orders.v1-0",
        "orders.v1-1",
        "orders.v1-2",
    ]
    assert json.loads((tmp_path / "topics.json").read_text()) == {
        "orders.v1": {
            "topic_id": str(info.topic_id),
            "partitions": 3,
            "configs": {"segment.bytes": "500", "cleanup.policy": "delete"},
        }
    }
    assert manager.topic_config("orders.v1") == LogConfig(segment_bytes=500, retention_ms=-1)
    log = manager.get("orders.v1", 2)
    assert log is not None and log.config.segment_bytes == 500
    assert manager.get("orders.v1", 3) is None
    assert [(topic, partition) for topic, partition, _ in manager.partitions()] == [
        ("orders.v1", 0),
        ("orders.v1", 1),
        ("orders.v1", 2),
    ]


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "has space", "slash/es", "ümlaut"])
def test_invalid_topic_names(manager: LogManager, name: str) -> None:
    with pytest.raises(InvalidTopicError) as caught:
        manager.create_topic(name, 1, {})
    assert caught.value.error_code == ErrorCode.invalid_topic_exception


def test_longest_valid_topic_name(manager: LogManager) -> None:
    manager.create_topic("a" * 249, 1, {})
    assert manager.get("a" * 249, 0) is not None


def test_create_topic_refusals(manager: LogManager) -> None:
    manager.create_topic("t", 1, {})
    with pytest.raises(TopicExistsError) as exists:
        manager.create_topic("t", 1, {})
    assert exists.value.error_code == ErrorCode.topic_already_exists
    with pytest.raises(InvalidPartitionsError) as partitions:
        manager.create_topic("u", 0, {})
    assert partitions.value.error_code == ErrorCode.invalid_partitions
    with pytest.raises(InvalidConfigError, match=r"forever for configuration retention\.ms") as config:
        manager.create_topic("u", 1, {"retention.ms": "forever"})
    assert config.value.error_code == ErrorCode.invalid_config
    assert list(manager.topics) == ["t"]


def test_validate_only_checks_without_creating(tmp_path: Path, manager: LogManager) -> None:
    assert manager.validate_new_topic("v", 2, {"segment.bytes": "100"}).segment_bytes == 100
    with pytest.raises(InvalidPartitionsError):
        manager.validate_new_topic("v", -1, {})
    assert "v" not in manager.topics and not (tmp_path / "v-0").exists()
    manager.create_topic("v", 2, {})
    manager.validate_new_partition_count("v", 3)
    assert manager.topics["v"].partitions == 2


def test_topics_and_data_persist_across_a_clean_restart(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, BROKER, now_ms=0)
    info = manager.create_topic("t", 2, {"retention.bytes": "123"})
    log = manager.get("t", 1)
    assert log is not None
    for _ in range(5):
        append(log, make_batch(2))
    manager.close()
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == "0\n2\nt 0 0\nt 1 10\n"

    reopened = LogManager(tmp_path, BROKER, now_ms=0)
    assert reopened.topics["t"] == info
    reopened_log = reopened.get("t", 1)
    assert reopened_log is not None
    assert reopened_log.log_end_offset == 10
    assert reopened_log.config.retention_bytes == 123
    assert len(read_all(reopened_log)) == 5
    reopened.close()


def test_delete_topic_removes_its_data_and_the_name_can_be_reused(
    tmp_path: Path, manager: LogManager
) -> None:
    manager.create_topic("gone", 2, {})
    manager.create_topic("kept", 1, {})
    log = manager.get("gone", 0)
    assert log is not None
    append(log, make_batch())
    manager.delete_topic("gone")
    assert sorted(path.name for path in tmp_path.iterdir() if path.is_dir()) == ["kept-0"]
    assert list(json.loads((tmp_path / "topics.json").read_text())) == ["kept"]
    assert manager.get("gone", 0) is None
    with pytest.raises(UnknownTopicError) as caught:
        manager.delete_topic("gone")
    assert caught.value.error_code == ErrorCode.unknown_topic_or_partition

    manager.create_topic("gone", 1, {})
    new_log = manager.get("gone", 0)
    assert new_log is not None and new_log.log_end_offset == 0


def test_create_partitions_only_grows(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, BROKER, now_ms=0)
    manager.create_topic("t", 2, {"segment.bytes": "300"})
    for count in (2, 1):
        with pytest.raises(InvalidPartitionsError):
            manager.create_partitions("t", count)
    with pytest.raises(UnknownTopicError):
        manager.create_partitions("nope", 5)
    manager.create_partitions("t", 4)
    new_log = manager.get("t", 3)
    assert new_log is not None and new_log.config.segment_bytes == 300
    manager.close()
    reopened = LogManager(tmp_path, BROKER, now_ms=0)
    assert reopened.topics["t"].partitions == 4
    assert reopened.get("t", 3) is not None
    reopened.close()


def test_partitions_made_while_their_topic_is_deleted_are_not_added(
    tmp_path: Path, manager: LogManager
) -> None:
    # Found by the fuzzer: a DeleteTopics between the making and the adding of new partitions
    # left the topic without its first partitions' logs, and the next request on it raised.
    manager.create_topic("t", 2, {})
    plan = manager.plan_partitions("t", 4)
    manager.make(plan)
    manager.delete_topic("t")
    with pytest.raises(UnknownTopicError):
        manager.add(plan)
    assert "t" not in manager.topics and not (tmp_path / "t-3").exists()
    manager.create_topic("t", 1, {})  # the name is free again
    assert manager.get("t", 0) is not None and manager.get("t", 1) is None


def test_a_data_dir_serves_one_broker_at_a_time(tmp_path: Path, manager: LogManager) -> None:
    with pytest.raises(DataDirLockedError, match="already in use"):
        LogManager(tmp_path, BROKER, now_ms=0)
    manager.close()
    LogManager(tmp_path, BROKER, now_ms=0).close()


def test_leftover_directories_are_cleaned_up_at_startup(tmp_path: Path) -> None:
    (tmp_path / "orphan-0").mkdir()
    (tmp_path / "orphan-0" / "00000000000000000000.log").write_bytes(make_batch())
    (tmp_path / "old.abc-delete").mkdir()
    (tmp_path / "not-a-partition").mkdir()
    manager = LogManager(tmp_path, BROKER, now_ms=0)
    names = sorted(path.name for path in tmp_path.iterdir() if path.is_dir())
    assert "old.abc-delete" not in names and "orphan-0" not in names and "not-a-partition" in names
    (stray,) = [name for name in names if name.endswith("-stray")]
    assert stray.startswith("orphan-0.")
    # The orphaned data does not leak into a new topic of that name.
    manager.create_topic("orphan", 1, {})
    log = manager.get("orphan", 0)
    assert log is not None and log.log_end_offset == 0
    manager.close()


def test_retention_uses_each_topic_config(manager: LogManager) -> None:
    manager.create_topic("small", 1, {"segment.bytes": "200", "retention.bytes": "0"})
    manager.create_topic("big", 1, {"segment.bytes": "200"})
    for topic in ("small", "big"):
        log = manager.get(topic, 0)
        assert log is not None
        for _ in range(10):
            append(log, make_batch(1, value_size=60))
    manager.apply_retention(now_ms=0)
    small, big = manager.get("small", 0), manager.get("big", 0)
    assert small is not None and big is not None
    assert small.log_start_offset == 9
    assert big.log_start_offset == 0


def test_a_checkpoint_after_a_flush_and_a_crash_recovers_the_rest(tmp_path: Path) -> None:
    # A real process that dies without closing anything, as after SIGKILL.
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from onceflow.log.config import LogConfig
        from onceflow.log.manager import LogManager
        from tests.log.batches import make_batch
        from tests.log.helpers import append

        manager = LogManager(Path({str(tmp_path)!r}), LogConfig(segment_bytes=500), now_ms=0)
        manager.create_topic("t", 1, {{}})
        log = manager.get("t", 0)
        for _ in range(20):
            append(log, make_batch(2, value_size=30))
        log.flush()
        manager.write_recovery_checkpoint()
        for _ in range(5):
            append(log, make_batch(2, value_size=30))
        os._exit(0)
        """
    )
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == "0\n1\nt 0 40\n"

    manager = LogManager(tmp_path, LogConfig(segment_bytes=500), now_ms=0)
    log = manager.get("t", 0)
    assert log is not None
    assert log.log_end_offset == 50  # the page cache kept the unflushed tail
    assert [h.base_offset for h in read_all(log)] == list(range(0, 50, 2))
    manager.close()
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == "0\n1\nt 0 50\n"
