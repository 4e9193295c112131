"""In a cluster a consumer's long poll waits for the high watermark, which a follower's report
moves; a move between the fetch's read and its wait must end the wait at once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from onceflow import EmbeddedBroker
from onceflow.apis import fetch
from onceflow.broker.core import Broker
from onceflow.cluster.zookeeper_server import ZooKeeperServer
from tests.cluster_mode.conftest import create_topic_at
from tests.conftest import wait_until
from tests.wire import WireClient, make_batch, produce

TOPIC = "gap"
LEADER, FOLLOWER = 1, 2


def _metadata(client: WireClient, *topics: str) -> Any:
    return client.request(
        3,
        12,
        topics=[{"topic_id": None, "name": topic} for topic in topics],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def _in_sync(client: WireClient) -> bool:
    described = _metadata(client, TOPIC).topics[0]
    return (
        described.error_code == 0
        and described.partitions[0].leader_id == LEADER
        and sorted(described.partitions[0].isr_nodes) == [LEADER, FOLLOWER]
    )


def test_a_follower_report_between_the_read_and_the_wait_ends_the_wait_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The leader ignores its follower's reports for a while, so a record is flushed there and
    # copied but not yet under the high watermark when the consumer reads. The report then
    # arrives in the gap before the long poll starts waiting; nothing wakes the wait after it
    # (no append, no flush, no further move), so only a wait that starts from the high
    # watermark the read saw answers before its 20 s.
    holding = [False]
    held: list[tuple[Broker, int]] = []  # the leader, and the offsets its follower fetched at
    follower_fetched = Broker.follower_fetched

    def held_follower_fetched(broker: Broker, topic: str, partition: int, replica: int, offset: int) -> None:
        if holding[0] and topic == TOPIC:
            held.append((broker, offset))
        else:
            follower_fetched(broker, topic, partition, replica, offset)

    long_poll = fetch._long_poll
    reported_in_the_gap: list[int] = []

    async def report_then_long_poll(
        request: Any, topics: Any, session: Any, reads: Any, seen: Any, follower: bool, deadline: float
    ) -> Any:
        if not follower and holding[0]:
            holding[0] = False
            partition_log = request.broker.logs.get(TOPIC, 0)
            follower_fetched(request.broker, TOPIC, 0, FOLLOWER, partition_log.log_end_offset)
            reported_in_the_gap.append(request.broker.high_watermark(TOPIC, 0, partition_log))
        return await long_poll(request, topics, session, reads, seen, follower, deadline)

    monkeypatch.setattr(Broker, "follower_fetched", held_follower_fetched)
    monkeypatch.setattr(fetch, "_long_poll", report_then_long_poll)
    with ZooKeeperServer() as zookeeper:
        settings = {"zookeeper.connect": zookeeper.connect_string, "zookeeper.session.timeout.ms": "4000"}
        with (
            EmbeddedBroker(tmp_path / "leader", config={**settings, "node.id": str(LEADER)}) as leader,
            EmbeddedBroker(tmp_path / "follower", config={**settings, "node.id": str(FOLLOWER)}),
            WireClient(leader.bootstrap_servers, timeout_s=30) as client,
        ):
            wait_until(lambda: len(_metadata(client).brokers) == 2, timeout_s=60)
            create_topic_at(client, TOPIC, [[LEADER, FOLLOWER]])
            wait_until(lambda: _in_sync(client), timeout_s=60)
            holding[0] = True
            assert produce(client, TOPIC, 0, make_batch([b"late"]), acks=1).error_code == 0
            # Copied: the follower fetches past the record. Flushed: the write-behind's turn.
            wait_until(lambda: any(offset == 1 for _, offset in held), timeout_s=30)
            in_leader = held[0][0].logs.get(TOPIC, 0)
            wait_until(lambda: in_leader.flushed_offset == 1, timeout_s=30)
            started = time.monotonic()
            answer = client.fetch({TOPIC: [0]}, max_wait=20_000, min_bytes=1)
            waited = time.monotonic() - started
    assert reported_in_the_gap == [1], "the report did not move the high watermark in the gap"
    assert answer.responses[0].partitions[0].records
    assert waited < 5, f"the fetch waited {waited:.1f} s for a high watermark that had already moved"
