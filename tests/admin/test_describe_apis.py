"""DescribeLogDirs (35) and DescribeTopicPartitions (75) through kafka-python's KafkaAdminClient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient

from onceflow import EmbeddedBroker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def described(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, KafkaAdminClient]]:
    with EmbeddedBroker(tmp_path / "data") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for future in admin.create_topics([NewTopic("alpha", 3), NewTopic("beta", 2)]).values():
            future.result(10)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})
        producer.produce("alpha", b"x" * 1000, partition=1)
        assert producer.flush(10) == 0
        client = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        yield broker, client
        client.close()


def test_log_dirs_report_each_partition_size(
    described: tuple[EmbeddedBroker, KafkaAdminClient], tmp_path: Path
) -> None:
    _, client = described
    [answer] = client.describe_log_dirs()
    [log_dir] = answer["log_dirs"]
    assert log_dir["error_code"] == 0
    assert log_dir["log_dir"] == str((tmp_path / "data").resolve())
    assert log_dir["total_bytes"] >= log_dir["usable_bytes"] > 0
    sizes = {
        (topic["name"], partition["partition_index"]): (partition["partition_size"], partition["offset_lag"])
        for topic in log_dir["topics"]
        for partition in topic["partitions"]
    }
    assert sizes[("alpha", 1)][0] > 1000
    assert sizes[("alpha", 0)] == (0, 0)
    assert {("beta", 0), ("beta", 1)} <= sizes.keys()

    [filtered] = client.describe_log_dirs({"alpha": [1], "missing": [0]})
    [topic] = filtered["log_dirs"][0]["topics"]
    assert topic["name"] == "alpha"
    assert [p["partition_index"] for p in topic["partitions"]] == [1]


def test_topic_partitions_come_in_pages(described: tuple[EmbeddedBroker, KafkaAdminClient]) -> None:
    _, client = described
    topics = ["beta", "alpha", "missing"]
    pages, cursor = [], None
    while True:
        page = client.describe_topic_partitions(topics, response_partition_limit=2, cursor=cursor)
        pages.append([(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in page["topics"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == [
        [("alpha", [0, 1])],
        [("alpha", [2]), ("beta", [0])],
        [("beta", [1]), ("missing", [])],
    ]
    [first] = client.describe_topic_partitions(["alpha"])["topics"]
    assert first["error_code"] == 0
    assert first["partitions"][0]["leader_id"] == 0
    assert first["partitions"][0]["replica_nodes"] == first["partitions"][0]["isr_nodes"] == [0]
    [unknown] = client.describe_topic_partitions(["missing"])["topics"]
    assert unknown["error_code"] == 3  # UNKNOWN_TOPIC_OR_PARTITION
