from __future__ import annotations

import pytest

from onceflow.log.config import LogConfig


def test_defaults_match_kafka() -> None:
    config = LogConfig()
    assert config.segment_bytes == 1024**3
    assert config.index_interval_bytes == 4096
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.retention_bytes == -1
    assert config.max_message_bytes == 1048588
    assert config.producer_id_expiration_ms == 86400000
    assert config.flush_interval_ms == 1000


def test_broker_keys() -> None:
    config = LogConfig.from_kafka(
        {
            "log.segment.bytes": "1000",
            "log.index.interval.bytes": "10",
            "log.retention.hours": "2",
            "log.retention.bytes": "5000",
            "message.max.bytes": "2000",
            "producer.id.expiration.ms": "60000",
            "log.flush.interval.ms": "50",
            "num.partitions": "3",  # not a log key: ignored
        }
    )
    assert config == LogConfig(1000, 10, 2 * 3_600_000, 5000, 2000, 60000, 50)


def test_topic_keys_overlay_a_base() -> None:
    base = LogConfig(segment_bytes=1000, retention_bytes=10)
    config = LogConfig.from_kafka(
        {
            "segment.bytes": "500",
            "retention.ms": "-1",
            "max.message.bytes": "100",
            "index.interval.bytes": "1",
        },
        base,
    )
    assert config == LogConfig(500, 1, -1, 10, 100)


def test_retention_ms_beats_minutes_and_hours_whatever_the_order() -> None:
    props = {"log.retention.ms": "5", "log.retention.hours": "1", "log.retention.minutes": "1"}
    assert LogConfig.from_kafka(props).retention_ms == 5
    assert (
        LogConfig.from_kafka({"log.retention.minutes": "2", "log.retention.hours": "1"}).retention_ms
        == 120_000
    )
    assert LogConfig.from_kafka({"log.retention.hours": "-1"}).retention_ms == -1


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"segment.bytes": "1GB"}, "segment.bytes must be an integer, got '1GB'"),
        ({"retention.ms": ""}, "retention.ms must be an integer"),
        ({"log.segment.bytes": "10"}, "log.segment.bytes must be at least 14"),
        ({"max.message.bytes": str(2**31)}, "max.message.bytes must be at most"),
        ({"producer.id.expiration.ms": "0"}, "at least 1"),
    ],
)
def test_bad_values_raise_readable_errors(props: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LogConfig.from_kafka(props)
