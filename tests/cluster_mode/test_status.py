"""`onceflow cluster status`: what it makes of a view (no ZooKeeper), and the command itself
against a live cluster's ZooKeeper."""

from __future__ import annotations

import json
import socket
import struct
import threading
import uuid

import pytest

from onceflow.admin.cluster import status_report
from onceflow.cluster.status import PartitionHealth, cluster_status
from onceflow.cluster.view import ClusterView
from onceflow.cluster.znodes import NO_LEADER, BrokerRegistration, PartitionState, TopicAssignment
from onceflow.cluster.zookeeper_server import free_port
from tests.cli.commands import onceflow
from tests.cluster_mode.conftest import BROKER_IDS, Cluster
from tests.cluster_mode.test_zookeeper_cluster import create_topic


def test_partitions_without_a_live_leader_are_offline_and_short_isrs_under_replicated() -> None:
    live = (2, 1)
    view = ClusterView(
        brokers={node: BrokerRegistration(node, "127.0.0.1", 9090 + node) for node in live},
        controller_id=2,
        controller_epoch=5,
        topics={"t": TopicAssignment(uuid.uuid4(), ((1, 2, 3), (2, 3, 1), (3, 1, 2), (1, 2, 3)))},
        states={
            ("t", 0): PartitionState(1, 0, (1, 2, 3), 5),  # healthy
            ("t", 1): PartitionState(2, 1, (2, 1), 5),  # under-replicated
            ("t", 2): PartitionState(3, 0, (3,), 5),  # its leader's broker is gone: offline
            # partition 3 has no state yet: offline
        },
    )
    status = cluster_status(view)
    assert status.brokers == ((1, "127.0.0.1", 9091), (2, "127.0.0.1", 9092))
    assert (status.controller_id, status.controller_epoch) == (2, 5)
    assert status.under_replicated == (PartitionHealth("t", 1, 2, (2, 3, 1), (2, 1)),)
    assert status.offline == (
        PartitionHealth("t", 2, NO_LEADER, (3, 1, 2), (3,)),
        PartitionHealth("t", 3, NO_LEADER, (1, 2, 3), ()),
    )
    report = status_report(status)
    assert report.data["controller"] == 2
    assert [row["leader"] for row in report.data["offline_partitions"]] == [None, None]
    assert report.data["coordinators"] == []  # no internal topic yet


def test_the_coordinator_of_a_key_is_the_leader_of_its_internal_partition() -> None:
    """The placement is Kafka's: Java's hash of "polygenelubricants" is Integer.MIN_VALUE, which
    Kafka's Utils.abs makes 0, so it lands on partition 0."""
    live = {node: BrokerRegistration(node, "127.0.0.1", 9090 + node) for node in (1, 2)}
    replicas = ((1, 2, 3), (2, 3, 1), (3, 1, 2))
    view = ClusterView(
        brokers=live,
        topics={"__consumer_offsets": TopicAssignment(uuid.uuid4(), replicas)},
        states={
            ("__consumer_offsets", 0): PartitionState(1, 4, (1, 2), 1),
            ("__consumer_offsets", 1): PartitionState(2, 0, (2, 1), 1),
            ("__consumer_offsets", 2): PartitionState(3, 0, (3,), 1),  # its leader is gone
        },
    )
    status = cluster_status(view, groups=["polygenelubricants"], transactional_ids=["t"])
    report = status_report(status)
    assert report.data["coordinators"] == [
        {"topic": "__consumer_offsets", "partitions": 3, "broker": 1, "leads": 1},
        {"topic": "__consumer_offsets", "partitions": 3, "broker": 2, "leads": 1},
    ]
    assert report.data["keys"] == [
        {
            "kind": "group",
            "key": "polygenelubricants",
            "topic": "__consumer_offsets",
            "partition": 0,
            "coordinator": 1,
        },
        {
            "kind": "transactional id",
            "key": "t",
            "topic": "__transaction_state",
            "partition": None,
            "coordinator": None,
        },
    ]


@pytest.mark.zookeeper
def test_the_command_reads_the_clusters_zookeeper(shared_cluster: Cluster) -> None:
    create_topic(shared_cluster, "watched", 2, 3)
    for partition in range(2):
        shared_cluster.wait_for_leader("watched", partition)
    result = onceflow("cluster", "status", "--zookeeper", shared_cluster.zookeeper.connect_string, "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert [broker["id"] for broker in status["brokers"]] == list(BROKER_IDS)
    assert status["controller"] in BROKER_IDS
    assert [row["topic"] for row in status["offline_partitions"]].count("watched") == 0
    tables = onceflow(
        "cluster", "status", "--zookeeper", shared_cluster.zookeeper.connect_string, "--group", "watchers"
    )
    assert tables.returncode == 0 and "controller: broker" in tables.stdout
    assert "coordinators of" in tables.stdout and "watchers" in tables.stdout


def test_an_unreachable_zookeeper_is_an_error_not_a_crash() -> None:
    address = f"127.0.0.1:{free_port()}"
    result = onceflow("cluster", "status", "--zookeeper", address, "--timeout", "1")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"onceflow cluster status: cannot reach ZooKeeper at {address}"
    ]


def _frame(sock: socket.socket) -> bytes:
    """One length-prefixed ZooKeeper frame, prefix included."""
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-frame")
        data += chunk
    return data


def test_a_zookeeper_lost_during_the_read_is_an_error_not_a_crash(shared_cluster: Cluster) -> None:
    # Between the command and ZooKeeper, a link that passes the session's handshake, then resets
    # both sides at the first request: kazoo raises ConnectionLoss mid-read. Later connects are refused.
    host, port = shared_cluster.zookeeper.connect_string.split(",")[0].rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))

    def drop_after_the_handshake() -> None:
        with listener:
            listener.settimeout(60)
            client, _ = listener.accept()
        with client, socket.create_connection((host, int(port)), timeout=30) as upstream:
            client.settimeout(30)
            upstream.sendall(_frame(client))  # ConnectRequest
            client.sendall(_frame(upstream))  # ConnectResponse: the session is up
            _frame(client)  # the first request, never answered
            for side in (client, upstream):
                side.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    link = threading.Thread(target=drop_after_the_handshake, daemon=True)
    link.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    result = onceflow("cluster", "status", "--zookeeper", address, "--timeout", "10")
    link.join(30)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"onceflow cluster status: ZooKeeper at {address} failed the read: ConnectionLoss"
    ]
