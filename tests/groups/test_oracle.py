"""Differential test: one raw group session against onceflow and the librdkafka mock cluster.

The mock's group coordinator answers generation and membership checks as Kafka does; those
answers must agree. Its gaps are not compared: no MEMBER_ID_REQUIRED round trip, no
protocol-type check, no OffsetFetch v7+, a LeaveGroup v3 answer it cannot encode,
TxnOffsetCommit checked against its own producer ids first, and no DescribeGroups,
ListGroups or DeleteGroups.
"""

from __future__ import annotations

from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from tests.conftest import FAST_JOINS
from tests.groups.helpers import commit, heartbeat, join_new, sync
from tests.wire import WireClient

TOPIC = "oracle"
GROUP = "oracle-group"


def _session(address: str) -> list[tuple[str, object]]:
    with WireClient(address) as client:
        joined = join_new(client, GROUP)
        member, generation = joined.member_id, joined.generation_id
        synced = sync(client, GROUP, generation, member, assignments={member: b"everything"})
        p0 = (TOPIC, 0)
        outcomes: list[tuple[str, object]] = [
            ("join", joined.error_code),
            ("sync", (synced.error_code, synced.assignment)),
            ("heartbeat", heartbeat(client, GROUP, generation, member)),
            ("heartbeat, stale generation", heartbeat(client, GROUP, generation - 1, member)),
            ("heartbeat, unknown member", heartbeat(client, GROUP, generation, "stranger")),
            ("commit, stale generation", commit(client, GROUP, {p0: 5}, generation - 1, member, version=7)),
            ("commit, unknown member", commit(client, GROUP, {p0: 5}, generation, "stranger", version=7)),
            ("simple commit to a group with members", commit(client, GROUP, {p0: 5}, version=7)),
            ("commit", commit(client, GROUP, {p0: 5}, generation, member, version=7)),
        ]
        topics = [{"name": TOPIC, "partition_indexes": [0, 1]}]
        (fetched,) = client.request(9, 5, group_id=GROUP, topics=topics).topics
        outcomes.append(("fetch", [(p.committed_offset, p.error_code) for p in fetched.partitions]))
        outcomes.append(("leave", client.request(13, 1, group_id=GROUP, member_id=member).error_code))
        outcomes.append(("heartbeat after leaving", heartbeat(client, GROUP, generation, member)))
        return outcomes


def test_group_errors_agree_with_the_librdkafka_mock_cluster() -> None:
    owner = Producer({"test.mock.num.brokers": 1})
    # Asking for the topic's metadata makes the mock create it (it does not answer CreateTopics).
    mock_broker = next(iter(owner.list_topics(TOPIC, timeout=10).brokers.values()))
    mock = _session(f"{mock_broker.host}:{mock_broker.port}")
    del owner
    with EmbeddedBroker(config=FAST_JOINS) as broker:
        with WireClient(broker.bootstrap_servers) as client:
            assert client.create_topic(TOPIC, 4) == ErrorCode.none
        ours = _session(broker.bootstrap_servers)
    assert ours == mock
    assert dict(ours)["commit, stale generation"] == {(TOPIC, 0): ErrorCode.illegal_generation}
