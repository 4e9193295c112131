"""Retention deletes whole old segments through the broker, driven by topic configs."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker
from tests.conftest import wait_until
from tests.wire import WireClient, make_batch, produce


def test_retention_bytes_deletes_old_segments(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path, config={"log.retention.check.interval.ms": "100"}) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        topic = NewTopic("short", 1, 1, config={"segment.bytes": "2000", "retention.bytes": "4000"})
        admin.create_topics([topic])["short"].result(timeout=30)
        with WireClient(broker.bootstrap_servers) as wire:
            for number in range(60):
                assert produce(wire, "short", 0, make_batch([b"x" * 200], -1)).base_offset == number
            # A check may run mid-way through the writes; wait for one that saw all of them.
            wait_until(lambda: len(list((tmp_path / "short-0").glob("*.log"))) <= 4, timeout_s=10)
            earliest = wire.list_offset("short", 0, timestamp=-2)
            assert wire.list_offset("short", 0) == 60
        segments = list((tmp_path / "short-0").glob("*.log"))
        assert len(segments) >= 2
        # A later check may still delete one more segment before the broker stops: never fewer.
        assert min(int(path.stem) for path in segments) >= earliest > 0


def test_retention_ms_keeps_recent_data(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path, config={"log.retention.check.interval.ms": "100"}) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        topic = NewTopic("recent", 1, 1, config={"segment.bytes": "2000", "retention.ms": "3600000"})
        admin.create_topics([topic])["recent"].result(timeout=30)
        with WireClient(broker.bootstrap_servers) as wire:
            for _ in range(30):
                produce(wire, "recent", 0, make_batch([b"x" * 200]))
            time.sleep(0.5)  # several retention checks pass
            assert wire.list_offset("recent", 0, timestamp=-2) == 0
