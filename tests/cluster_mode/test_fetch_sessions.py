"""Followers' fetch sessions (KIP-227): the leader's cache, a follower's requests, a leader on the wire."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.fetch_sessions import SESSIONS_PER_FOLLOWER, FetchSessions
from onceflow.broker.replication import RETRY_AFTER_S, FollowedPartition, LeaderFetcher
from tests.cluster_mode.conftest import Cluster, create_topic_with_assignments
from tests.conftest import wait_until
from tests.log.batches import make_batch as make_log_batch
from tests.log.helpers import append, open_log
from tests.wire import WireClient, make_batch, produce


def topics(**offsets: int) -> list[Any]:
    """A request's topics: `p0=5` asks for partition 0 of topic t from offset 5."""
    partitions = [
        SimpleNamespace(partition=int(name[1:]), fetch_offset=offset, partition_max_bytes=100)
        for name, offset in offsets.items()
    ]
    return [SimpleNamespace(topic="t", partitions=partitions)]


def answer(
    partition: int, high_watermark: int, records: bytes = b"", error: ErrorCode = ErrorCode.none
) -> Any:
    return {
        "partition_index": partition,
        "error_code": error,
        "high_watermark": high_watermark,
        "last_stable_offset": high_watermark,
        "log_start_offset": 0,
        "records": records,
    }


def test_an_answer_in_a_session_holds_only_what_the_follower_does_not_know() -> None:
    session = FetchSessions().open(2, topics(p0=0, p1=0, p2=0))
    first = session.changes([{"topic": "t", "partitions": [answer(0, 3), answer(1, 0), answer(2, 0)]}])
    assert [p["partition_index"] for p in first[0]["partitions"]] == [0, 1, 2]  # all new to it
    again = session.changes([{"topic": "t", "partitions": [answer(0, 3), answer(1, 0), answer(2, 0)]}])
    assert again == []
    news = session.changes(
        [
            {
                "topic": "t",
                "partitions": [
                    answer(0, 4),
                    answer(1, 0, b"batch"),
                    answer(2, 0, error=ErrorCode.kafka_storage_error),
                ],
            }
        ]
    )
    assert [p["partition_index"] for p in news[0]["partitions"]] == [0, 1, 2]
    # The partition that brought records goes last in the next read; an error is news each time.
    assert [key[1] for key in session.partitions] == [0, 2, 1]
    assert [
        p["partition_index"]
        for p in session.changes(
            [{"topic": "t", "partitions": [answer(2, 0, error=ErrorCode.kafka_storage_error)]}]
        )[0]["partitions"]
    ] == [2]


def test_a_session_takes_moved_offsets_and_forgets_partitions() -> None:
    session = FetchSessions().open(2, topics(p0=0, p1=0))
    session.update(topics(p1=7), [SimpleNamespace(topic="t", partitions=[0])])
    assert {key: wanted.fetch_offset for key, wanted in session.partitions.items()} == {("t", 1): 7}
    assert [topic.topic for topic in session.topics()] == ["t"]


def test_a_fetch_continues_a_session_only_at_its_epoch_and_from_its_follower() -> None:
    sessions = FetchSessions()
    session = sessions.open(2, topics(p0=0))
    assert sessions.next_fetch(2, session.session_id, 2) == ErrorCode.invalid_fetch_session_epoch
    assert sessions.next_fetch(3, session.session_id, 1) == ErrorCode.fetch_session_id_not_found
    assert sessions.next_fetch(2, session.session_id, 1) is session
    assert sessions.next_fetch(2, session.session_id, 1) == ErrorCode.invalid_fetch_session_epoch
    assert sessions.next_fetch(2, session.session_id, 2) is session
    later = [sessions.open(2, topics(p0=0)) for _ in range(SESSIONS_PER_FOLLOWER)]
    assert sessions.next_fetch(2, session.session_id, 3) == ErrorCode.fetch_session_id_not_found  # dropped
    assert sessions.next_fetch(2, later[0].session_id, 1) is later[0]
    sessions.close(3, later[0].session_id)  # another follower's: kept
    assert sessions.next_fetch(2, later[0].session_id, 2) is later[0]
    sessions.close(2, later[0].session_id)  # a FINAL fetch closes it
    assert sessions.next_fetch(2, later[0].session_id, 3) == ErrorCode.fetch_session_id_not_found


def fetch(
    client: WireClient,
    session_id: int,
    epoch: int,
    partitions: dict[int, int],
    replica_id: int,
    leader_epoch: int = -1,
) -> Any:
    """A Fetch v12 of topic `sessions`, answered at once; `leader_epoch` is the leader epoch the
    fetcher knows (-1: none)."""
    return client.request(
        1,
        12,
        replica_id=replica_id,
        max_wait=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=session_id,
        session_epoch=epoch,
        topics=[
            {
                "topic": "sessions",
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": leader_epoch,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                    for partition, offset in partitions.items()
                ],
            }
        ]
        if partitions
        else [],
        forgotten_topics_data=[],
        rack_id="",
    )


class Follower:
    """A follower's side of one session: its id, and the epoch of its next fetch."""

    def __init__(self, client: WireClient, replica_id: int) -> None:
        self.client = client
        self.replica_id = replica_id
        self.session_id = 0
        self.epoch = 0

    def fetch(self, partitions: dict[int, int]) -> dict[int, int]:
        """Partition -> bytes of records, for the partitions the answer lists."""
        response = fetch(self.client, self.session_id, self.epoch, partitions, self.replica_id)
        assert response.error_code == 0
        if self.epoch == 0:
            self.session_id = response.session_id
        self.epoch += 1
        return listed(response)


def listed(response: Any) -> dict[int, int]:
    return {p.partition_index: len(p.records or b"") for t in response.responses for p in t.partitions}


@pytest.mark.zookeeper
def test_a_leader_answers_a_followers_session_with_what_changed(cluster: Cluster) -> None:
    # The test fetches in the name of broker 3, a follower (a broker that is no replica is
    # refused); the real one fetches on beside it, in a session of its own.
    create_topic_with_assignments(cluster, "sessions", [[1, 2, 3]] * 3)
    for partition in range(3):
        cluster.wait_for_leader("sessions", partition)
    with WireClient(cluster.brokers[1].bootstrap_servers) as client:
        assert produce(client, "sessions", 0, make_batch([b"a", b"b"])).error_code == 0
        follower = Follower(client, replica_id=3)
        opened = follower.fetch({0: 0, 1: 0, 2: 0})
        assert follower.session_id != 0
        assert opened.keys() == {0, 1, 2} and opened[0] > 0 and opened[1] == opened[2] == 0
        follower.fetch({0: 2})  # it appended those two records
        # Nothing named, nothing new (once the leader's high watermark is where it stays): an
        # empty answer, though the session holds three partitions.
        wait_until(lambda: follower.fetch({}) == {}, timeout_s=10)
        assert produce(client, "sessions", 2, make_batch([b"c"])).error_code == 0
        news = follower.fetch({})
        assert news.keys() == {2} and news[2] > 0

        stale = fetch(client, follower.session_id, follower.epoch - 1, {}, replica_id=3)
        assert stale.error_code == ErrorCode.invalid_fetch_session_epoch
        unknown = fetch(client, follower.session_id + 1000, 1, {}, replica_id=3)
        assert unknown.error_code == ErrorCode.fetch_session_id_not_found
        # Declined, with a full answer: for a consumer, and for a replica id no broker has.
        for replica_id in (-1, 99):
            declined = fetch(client, 0, 0, {0: 0, 1: 0, 2: 0}, replica_id)
            assert declined.session_id == 0 and listed(declined).keys() == {0, 1, 2}
        # A FINAL fetch (epoch -1) gets a full answer without a session and closes this one.
        final = fetch(client, follower.session_id, -1, {0: 0, 1: 0, 2: 0}, replica_id=3)
        assert final.session_id == 0 and listed(final).keys() == {0, 1, 2}
        closed = fetch(client, follower.session_id, follower.epoch, {}, replica_id=3)
        assert closed.error_code == ErrorCode.fetch_session_id_not_found


@pytest.mark.zookeeper
def test_a_fetch_with_another_leader_epoch_is_fenced_and_copies_nothing(cluster: Cluster) -> None:
    # KIP-320: a follower (or consumer) with a stale view of the leadership must neither copy
    # from this leader nor have its fetch offset taken as its log end; in a session too.
    create_topic_with_assignments(cluster, "sessions", [[1, 2, 3]])
    cluster.wait_for_leader("sessions", 0)
    with WireClient(cluster.brokers[1].bootstrap_servers) as client:
        assert produce(client, "sessions", 0, make_batch([b"a"]), acks=-1).error_code == 0
    # Broker 2 or 3 leads (2 unless a stall of the machine ended its ZooKeeper session and so
    # its ISR membership), in a later epoch than broker 1's: an older one exists to fence.
    # The test fetches in the name of the other one, a follower.
    cluster.brokers[1].kill()
    moved = cluster.wait_for_leader("sessions", 0, not_on=1)
    leader_epoch = moved.leader_epoch
    assert leader_epoch >= 1 and moved.leader_id in (2, 3)
    follower = ({2, 3} - {moved.leader_id}).pop()
    with WireClient(cluster.brokers[moved.leader_id].bootstrap_servers) as client:
        # A broker that is no replica is no follower: it reads nothing past the high watermark.
        stranger = fetch(client, 0, 0, {0: 0}, 4, leader_epoch=leader_epoch).responses[0].partitions[0]
        assert stranger.error_code == ErrorCode.not_leader_or_follower and not stranger.records
        answers = {
            epoch: fetch(client, 0, 0, {0: 0}, follower, leader_epoch=epoch).responses[0].partitions[0]
            for epoch in (leader_epoch - 1, leader_epoch, leader_epoch + 1)
        }
        assert answers[leader_epoch - 1].error_code == ErrorCode.fenced_leader_epoch
        assert answers[leader_epoch - 1].current_leader.leader_epoch == leader_epoch
        assert answers[leader_epoch + 1].error_code == ErrorCode.unknown_leader_epoch
        assert not answers[leader_epoch - 1].records and not answers[leader_epoch + 1].records
        assert answers[leader_epoch].error_code == ErrorCode.none and answers[leader_epoch].records
        # A session keeps the epoch its partitions were last named with: a fetch that names
        # none is checked against it.
        opened = fetch(client, 0, 0, {0: 0}, follower, leader_epoch=leader_epoch - 1)
        assert opened.session_id != 0
        again = fetch(client, opened.session_id, 1, {}, follower).responses[0].partitions[0]
        assert again.error_code == ErrorCode.fenced_leader_epoch


class RecordingLink:
    """Stands in for the connection to the leader: records each Fetch, answers with no errors
    and the given session id."""

    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        self.fetches: list[dict[str, Any]] = []

    async def fetch(self, fields: dict[str, Any]) -> Any:
        self.fetches.append(fields)
        return SimpleNamespace(error_code=ErrorCode.none, session_id=self.session_id, responses=[])


def named(fields: dict[str, Any]) -> dict[int, int]:
    return {p["partition"]: p["fetch_offset"] for t in fields["topics"] for p in t["partitions"]}


@pytest.mark.parametrize("session_id", [7, 0])  # a leader with sessions, and one that declines them
def test_a_follower_names_only_the_partitions_whose_offset_moved(tmp_path: Path, session_id: int) -> None:
    logs = [open_log(tmp_path / f"t-{partition}") for partition in range(3)]
    followed = [
        FollowedPartition("t", partition, log, 0, 0, truncated=True) for partition, log in enumerate(logs)
    ]
    fetcher = LeaderFetcher(2, ("127.0.0.1", 1), followed, lambda *_: None, lambda: None)
    link = RecordingLink(session_id)

    async def three_fetches() -> None:
        await fetcher._fetch(link, followed, 0)
        append(logs[1], make_log_batch(2))
        await fetcher._fetch(link, followed, 0)
        await fetcher._fetch(link, followed[:2], 0)  # partition 2 backs off

    asyncio.run(three_fetches())
    if session_id:
        assert [(f["session_id"], f["session_epoch"]) for f in link.fetches] == [(0, 0), (7, 1), (0, 0)]
        assert [named(f) for f in link.fetches] == [{0: 0, 1: 0, 2: 0}, {1: 2}, {0: 0, 1: 2}]
    else:
        assert [(f["session_id"], f["session_epoch"]) for f in link.fetches] == [(0, 0), (0, -1), (0, -1)]
        assert [named(f) for f in link.fetches] == [{0: 0, 1: 0, 2: 0}, {0: 0, 1: 2, 2: 0}, {0: 0, 1: 2}]


class ScriptedLink(RecordingLink):
    """Answers with the given top-level errors in turn, then breaks as a lost connection does."""

    def __init__(self, session_id: int, errors: list[ErrorCode]) -> None:
        super().__init__(session_id)
        self.errors = errors

    async def fetch(self, fields: dict[str, Any]) -> Any:
        if not self.errors:
            raise ConnectionResetError("the test is over")
        answer = await super().fetch(fields)
        answer.error_code = self.errors.pop(0)
        return answer


def test_a_follower_whose_session_the_leader_lost_opens_another_at_once(tmp_path: Path) -> None:
    followed = [FollowedPartition("t", 0, open_log(tmp_path / "t-0"), 0, 0, truncated=True)]
    fetcher = LeaderFetcher(2, ("127.0.0.1", 1), followed, lambda *_: None, lambda: None)
    errors = [ErrorCode.none, ErrorCode.fetch_session_id_not_found, ErrorCode.none]
    errors += [ErrorCode.invalid_fetch_session_epoch, ErrorCode.none, ErrorCode.none]
    link = ScriptedLink(7, errors)
    started = time.monotonic()
    with pytest.raises(ConnectionResetError):
        asyncio.run(fetcher._follow(link))
    epochs = [fetched["session_epoch"] for fetched in link.fetches]
    assert epochs == [0, 1, 0, 1, 0, 1]
    assert time.monotonic() - started < RETRY_AFTER_S  # no back-off: nothing is wrong with the data


@pytest.mark.zookeeper
def test_idle_partitions_in_a_session_keep_their_followers_in_the_isr(quick_lag_cluster: Cluster) -> None:
    """A follower names only the partitions whose offset moved; the leader must still count it
    as caught up on the others, or it drops the follower from their ISR after 1 s."""
    create_topic_with_assignments(quick_lag_cluster, "isr", [[1, 2, 3]] * 3)
    for partition in range(3):
        quick_lag_cluster.wait_for_leader("isr", partition)
    with WireClient(quick_lag_cluster.brokers[1].bootstrap_servers) as client:
        deadline = time.monotonic() + 3  # three times the lag limit, partition 0 loaded
        while time.monotonic() < deadline:
            assert produce(client, "isr", 0, make_batch([b"x" * 1000] * 10)).error_code == 0
    for partition in range(3):
        assert sorted(quick_lag_cluster.partition(1, "isr", partition).isr_nodes) == [1, 2, 3]
