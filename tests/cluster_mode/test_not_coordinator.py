"""A group or transactional id is coordinated by one broker of a cluster, the leader of its
partition of the internal topic; the others answer its requests NOT_COORDINATOR, as Kafka's
brokers do, so that clients look the coordinator up again instead of being served a stale copy.
Before, a group whose coordinator died and came back was split over two coordinators, and each
gave its members every partition."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer
from kio.schema.errors import ErrorCode

from tests.cluster_mode.conftest import BROKER_IDS, Cluster, create_topic_with_assignments
from tests.cluster_mode.test_zookeeper_cluster import create_topic
from tests.conftest import wait_until
from tests.groups.helpers import commit, fetch
from tests.wire import WireClient

pytestmark = pytest.mark.zookeeper

NC = ErrorCode.not_coordinator
OFFSETS = [
    {
        "name": "t",
        "partitions": [
            {
                "partition_index": 0,
                "committed_offset": 1,
                "committed_leader_epoch": -1,
                "committed_metadata": "",
            }
        ],
    }
]
# (api key, version, fields, where the answer's error is)
REQUESTS: list[tuple[str, int, int, dict[str, Any], Callable[[Any], Any]]] = [
    (
        "JoinGroup",
        11,
        5,
        {
            "group_id": "g",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
        },
        lambda r: r.error_code,
    ),
    (
        "Heartbeat",
        12,
        4,
        {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None},
        lambda r: r.error_code,
    ),
    (
        "LeaveGroup",
        13,
        3,
        {"group_id": "g", "members": [{"member_id": "m", "group_instance_id": None}]},
        lambda r: r.error_code,
    ),
    (
        "SyncGroup",
        14,
        3,
        {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None, "assignments": []},
        lambda r: r.error_code,
    ),
    (
        "OffsetCommit",
        8,
        8,
        {
            "group_id": "g",
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": OFFSETS,
        },
        lambda r: r.topics[0].partitions[0].error_code,
    ),
    ("OffsetFetch", 9, 6, {"group_id": "g", "topics": None}, lambda r: r.error_code),
    (
        "OffsetFetch",
        9,
        1,
        {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0]}]},
        lambda r: r.topics[0].partitions[0].error_code,  # v1 has no error code of its own
    ),
    (
        "OffsetFetch",
        9,
        8,
        {"groups": [{"group_id": "g", "topics": None}], "require_stable": False},
        lambda r: r.groups[0].error_code,
    ),
    (
        "DescribeGroups",
        15,
        5,
        {"groups": ["g"], "include_authorized_operations": False},
        lambda r: r.groups[0].error_code,
    ),
    ("DeleteGroups", 42, 2, {"groups_names": ["g"]}, lambda r: r.results[0].error_code),
    (
        "OffsetDelete",
        47,
        0,
        {"group_id": "g", "topics": [{"name": "t", "partitions": [{"partition_index": 0}]}]},
        lambda r: r.error_code,
    ),
    (
        "InitProducerId",
        22,
        4,
        {"transactional_id": "x", "transaction_timeout": 10_000, "producer_id": -1, "producer_epoch": -1},
        lambda r: r.error_code,
    ),
    (
        "AddPartitionsToTxn",
        24,
        3,
        {
            "v3_and_below_transactional_id": "x",
            "v3_and_below_producer_id": 1,
            "v3_and_below_producer_epoch": 0,
            "v3_and_below_topics": [{"name": "t", "partitions": [0]}],
        },
        lambda r: r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
    ),
    (
        "AddOffsetsToTxn",
        25,
        3,
        {"transactional_id": "x", "producer_id": 1, "producer_epoch": 0, "group_id": "g"},
        lambda r: r.error_code,
    ),
    (
        "EndTxn",
        26,
        3,
        {"transactional_id": "x", "producer_id": 1, "producer_epoch": 0, "committed": True},
        lambda r: r.error_code,
    ),
    (
        "TxnOffsetCommit",
        28,
        3,
        {
            "transactional_id": "x",
            "group_id": "g",
            "producer_id": 1,
            "producer_epoch": 0,
            "generation_id": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": OFFSETS,
        },
        lambda r: r.topics[0].partitions[0].error_code,
    ),
]


def coordinator_of(cluster: Cluster, key: str = "g", key_type: int = 0) -> int:
    return cluster.coordinator(key, key_type)


@pytest.mark.parametrize(
    ("name", "api_key", "version", "fields", "error_of"), REQUESTS, ids=[r[0] + f"-v{r[2]}" for r in REQUESTS]
)
def test_brokers_that_do_not_coordinate_answer_not_coordinator(
    shared_cluster: Cluster,
    name: str,
    api_key: int,
    version: int,
    fields: dict[str, Any],
    error_of: Callable[[Any], Any],
) -> None:
    key_type = 1 if api_key in (22, 24, 25, 26) else 0  # the transactional id "x", else the group "g"
    key = "x" if key_type else "g"
    coordinator_of(shared_cluster, key, key_type)  # creates the internal topic
    # Until every broker has applied the new topic's leaders, one may still answer NOT_COORDINATOR
    # for a partition it leads in ZooKeeper (a loaded machine takes seconds for 50 partitions).
    wait_until(
        lambda: len(seen := _named_by_each(shared_cluster, key, key_type)) == 1 and seen <= set(BROKER_IDS),
        60,
    )
    coordinator = coordinator_of(shared_cluster, key, key_type)
    for broker_id in BROKER_IDS:
        with WireClient(shared_cluster.brokers[broker_id].bootstrap_servers) as client:
            error = error_of(client.request(api_key, version, **fields))
        assert (broker_id, error == NC) == (broker_id, broker_id != coordinator), (name, error)


def _named_by_each(cluster: Cluster, key: str, key_type: int) -> set[int]:
    """The coordinators of `key` that the brokers name, each from its own view."""
    named = set()
    for broker in cluster.brokers.values():
        with WireClient(broker.bootstrap_servers) as client:
            found = client.request(10, 4, key_type=key_type, coordinator_keys=[key])
        named.add(int(found.coordinators[0].node_id))
    return named


class Member:
    """A confluent-kafka consumer of the group on a thread, with the partitions it holds now."""

    def __init__(self, bootstrap: str) -> None:
        self.held: set[int] = set()
        self.stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "split",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
        self.consumer.subscribe(
            ["split"],
            on_assign=lambda _, partitions: self.held.update(p.partition for p in partitions),
            on_revoke=lambda _, partitions: self.held.difference_update(p.partition for p in partitions),
        )
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.1)
        self.consumer.close()

    def leave(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def one_owner_each(members: list[Member]) -> bool:
    held = [sorted(member.held) for member in members]
    owned = [partition for partitions in held for partition in partitions]
    return all(held) and sorted(owned) == [0, 1, 2, 3]


def test_a_group_stays_one_group_when_its_coordinator_dies_and_comes_back(cluster: Cluster) -> None:
    create_topic(cluster, "split", 4, 3)
    bootstrap = ",".join(broker.bootstrap_servers for broker in cluster.brokers.values())
    members = [Member(bootstrap), Member(bootstrap)]
    try:
        wait_until(lambda: one_owner_each(members), timeout_s=60)
        first = coordinator_of(cluster, "split")
        cluster.brokers[first].kill()
        wait_until(lambda: coordinator_of(cluster, "split") not in (first, -1), timeout_s=60)
        second = coordinator_of(cluster, "split")
        wait_until(lambda: one_owner_each(members), timeout_s=60)
        cluster.brokers[first].start()
        # It comes back as a follower of the offsets partition: the group stays with `second`.
        wait_until(lambda: len(cluster.live()) == len(BROKER_IDS), timeout_s=60)
        members.append(Member(bootstrap))
        wait_until(lambda: one_owner_each(members), timeout_s=60)
        assert coordinator_of(cluster, "split") == second
        with WireClient(cluster.brokers[first].bootstrap_servers) as client:
            assert "split" not in [group.group_id for group in client.request(16, 4, states_filter=[]).groups]
    finally:
        for member in members:
            member.leave()


def test_the_coordinator_keeps_offsets_of_a_partition_it_holds_no_replica_of(shared_cluster: Cluster) -> None:
    wait_until(lambda: coordinator_of(shared_cluster, "elsewhere") in BROKER_IDS)
    coordinator = coordinator_of(shared_cluster, "elsewhere")
    elsewhere = next(broker_id for broker_id in BROKER_IDS if broker_id != coordinator)
    create_topic_with_assignments(shared_cluster, "held-elsewhere", [[elsewhere]])
    shared_cluster.wait_for_leader("held-elsewhere")
    with WireClient(shared_cluster.brokers[coordinator].bootstrap_servers) as client:
        assert commit(client, "elsewhere", {("held-elsewhere", 0): 5}) == {
            ("held-elsewhere", 0): ErrorCode.none
        }
        assert fetch(client, "elsewhere", [("held-elsewhere", 0)]) == {
            ("held-elsewhere", 0): (5, ErrorCode.none)
        }
