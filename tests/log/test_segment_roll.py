"""Segments roll by time as Kafka's do (segment.ms, segment.jitter.ms, log.roll.*): on the first
append once the segment is older than segment.ms, counted from its first batch's timestamp, or
from when it was made for batches without one."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from onceflow import EmbeddedBroker
from onceflow.log.config import LogConfig
from tests.conftest import wait_until
from tests.log.batches import make_batch
from tests.log.helpers import append, open_log, segment_files

T = 1_700_000_000_000


def test_a_segment_rolls_once_its_batches_span_segment_ms(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_ms=1000)
    append(log, make_batch(timestamp=T))
    append(log, make_batch(timestamp=T + 1000))  # 1000 ms: not older than segment.ms yet
    assert log.segment_count == 1
    append(log, make_batch(timestamp=T + 1001))
    assert [segment.base_offset for segment in log.segments] == [0, 2]
    append(log, make_batch(timestamp=T + 1500))  # the new segment counts from its own first batch
    assert log.segment_count == 2
    log.close()

    control = open_log(tmp_path / "control")  # Kafka's default, 7 days
    for timestamp in (T, T + 1001, T + 3_600_000):
        append(control, make_batch(timestamp=timestamp))
    assert control.segment_count == 1
    control.close()


def test_without_timestamps_the_age_runs_from_the_segments_creation(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_ms=1000)
    created = log.segments[-1].created_ms
    append(log, make_batch(timestamp=-1, max_timestamp=-1), now_ms=created)
    append(log, make_batch(timestamp=-1, max_timestamp=-1), now_ms=created + 1000)
    assert log.segment_count == 1
    append(log, make_batch(timestamp=-1, max_timestamp=-1), now_ms=created + 1001)
    assert log.segment_count == 2
    log.close()


def test_a_reopened_segment_counts_from_the_first_batch_on_disk(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_ms=1000)
    append(log, make_batch(timestamp=T))
    append(log, make_batch(timestamp=T + 600))
    log.close()
    reopened = open_log(tmp_path / "p", recovery_point=2, segment_ms=1000)
    append(reopened, make_batch(timestamp=T + 900))  # within segment.ms of the first batch
    assert reopened.segment_count == 1
    append(reopened, make_batch(timestamp=T + 1200))  # past it, though the reopened file is new
    assert reopened.segment_count == 2
    reopened.close()


def test_each_segment_draws_a_jitter_below_segment_jitter_ms(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_ms=10_000, segment_jitter_ms=4_000)
    append(log, make_batch(timestamp=T))
    append(log, make_batch(timestamp=T + 1))  # the first check draws the active segment's jitter
    jitter = log.segments[-1].roll_jitter_ms
    assert jitter is not None and 0 <= jitter < 4_000
    append(log, make_batch(timestamp=T + 10_000 - jitter))
    assert log.segment_count == 1
    append(log, make_batch(timestamp=T + 10_000 - jitter + 1))
    assert log.segment_count == 2
    log.close()


def test_broker_and_topic_keys_set_the_roll_time() -> None:
    assert LogConfig.from_kafka({"log.roll.hours": "2"}).segment_ms == 7_200_000
    assert LogConfig.from_kafka({"log.roll.hours": "2", "log.roll.ms": "5"}).segment_ms == 5
    topic = LogConfig.from_kafka({"segment.ms": "7", "segment.jitter.ms": "3"}, LogConfig(segment_ms=5))
    assert (topic.segment_ms, topic.segment_jitter_ms) == (7, 3)
    assert LogConfig.from_kafka({"log.roll.jitter.hours": "1"}).segment_jitter_ms == 3_600_000


def test_segment_ms_lets_time_retention_delete_what_a_client_wrote(tmp_path: Path) -> None:
    """What users set segment.ms for: records older than retention.ms go, though the topic
    never filled a segment. The control topic, without segment.ms, keeps them in its one
    active segment, which retention never deletes."""
    now_ms = int(time.time() * 1000)
    with EmbeddedBroker(tmp_path, config={"log.retention.check.interval.ms": "100"}) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        timed = NewTopic("timed", 1, 1, config={"segment.ms": "1000", "retention.ms": "3600000"})
        control = NewTopic("untimed", 1, 1, config={"retention.ms": "3600000"})
        for future in admin.create_topics([timed, control]).values():
            future.result(timeout=30)
        described = ConfigResource(ConfigResource.Type.TOPIC, "timed")
        configs = admin.describe_configs([described])[described].result(timeout=30)
        assert configs["segment.ms"].value == "1000"
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
        for topic in ("timed", "untimed"):
            producer.produce(topic, b"old", timestamp=now_ms - 7_200_000)  # two hours old
            producer.flush(30)
            producer.produce(topic, b"new", timestamp=now_ms)
            assert producer.flush(30) == 0
        wait_until(lambda: segment_files(tmp_path / "timed-0") == [tmp_path / "timed-0" / f"{1:020d}.log"])
        assert (start_offset(admin, "timed"), start_offset(admin, "untimed")) == (1, 0)
        assert len(segment_files(tmp_path / "untimed-0")) == 1


def start_offset(admin: AdminClient, topic: str) -> int:
    wanted = {TopicPartition(topic, 0): OffsetSpec.earliest()}
    return int(admin.list_offsets(wanted)[TopicPartition(topic, 0)].result(timeout=30).offset)
