"""ZooKeeper out of reach (SIGSTOPped) costs a broker nothing it can do without it: an
InitProducerId that needs a new block of producer ids is answered COORDINATOR_LOAD_IN_PROGRESS at
once, and every other client keeps being served; once ZooKeeper is back the ids come. A topic
whose creation was in flight when the connection dropped is created once it is back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from kazoo.client import KazooState
from kio.schema.errors import ErrorCode

from onceflow.broker.producer_ids import BLOCK_SIZE
from onceflow.cluster.zk import ZooKeeperCluster
from onceflow.cluster.zookeeper_server import ZooKeeperServer
from onceflow.faults.broker_process import paused
from tests.cluster_mode.conftest import Cluster, create_assigned_topic
from tests.conftest import wait_until
from tests.wire import WireClient, make_batch, produce

pytestmark = pytest.mark.zookeeper

MAX_WAIT_S = 1.0  # before, the broker served nothing for 25-34 s


class _Producing(threading.Thread):
    """Another client producing acks=1 to the same broker, timing each answer."""

    def __init__(self, address: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.address, self.topic = address, topic
        self.slowest, self.answers = 0.0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        with WireClient(self.address) as wire:
            while not self.stop.is_set():
                started = time.perf_counter()
                assert produce(wire, self.topic, 0, make_batch([b"steady"]), acks=1).error_code == 0
                self.slowest = max(self.slowest, time.perf_counter() - started)
                self.answers += 1
                self.stop.wait(0.02)


def test_init_producer_id_during_a_zookeeper_outage_keeps_the_broker_serving(cluster: Cluster) -> None:
    create_assigned_topic(cluster, "steady", [1])
    cluster.wait_for_leader("steady")
    broker = cluster.brokers[1]
    producing = _Producing(broker.bootstrap_servers, "steady")
    producing.start()
    wait_until(lambda: producing.answers > 5, 30)
    assert cluster.zookeeper.process is not None
    try:
        with paused([cluster.zookeeper.process]), WireClient(broker.bootstrap_servers) as wire:
            # The ids it holds (a block, and the next one asked for ahead) run out; then it needs
            # ZooKeeper, and says so at once.
            codes = []
            for _ in range(2 * BLOCK_SIZE + 1):
                started = time.perf_counter()
                codes.append(wire.init_producer_id().error_code)
                assert time.perf_counter() - started < MAX_WAIT_S
                if codes[-1] != ErrorCode.none:
                    break
            assert codes[-1] == ErrorCode.coordinator_load_in_progress
            assert wire.init_producer_id().error_code == ErrorCode.coordinator_load_in_progress
            answers_before = producing.answers
            wait_until(lambda: producing.answers > answers_before + 5, 10)
        with WireClient(broker.bootstrap_servers) as wire:
            wait_until(lambda: wire.init_producer_id().error_code == ErrorCode.none, 60)
    finally:
        producing.stop.set()
        producing.join(10)
    assert producing.slowest < MAX_WAIT_S, f"a produce waited {producing.slowest:.2f} s"


def test_a_topic_created_while_the_zookeeper_connection_drops_is_created_once_it_is_back() -> None:
    """The write is in flight when ZooKeeper stops answering; the connection drops (a
    ConnectionLoss, which leaves it unknown whether the write happened) and comes back. Before,
    the ConnectionLoss ended CreateTopics with an internal error and a closed connection."""
    with ZooKeeperServer() as zookeeper:
        assert zookeeper.process is not None
        cluster = ZooKeeperCluster(zookeeper.connect_string, 1, 2000, 10_000, False, lambda view: None)
        cluster.client.start(30)
        for parent in ("/config/topics", "/brokers/topics"):  # as a broker's join makes them
            cluster.client.ensure_path(parent)

        async def create_across_the_drop() -> None:
            with paused([zookeeper.process]):
                creating = asyncio.ensure_future(cluster.create_topic("orders", ((1,),), {}))
                while cluster.client.state == KazooState.CONNECTED:
                    await asyncio.sleep(0.05)
            topic_id = await asyncio.wait_for(creating, 60)
            stored = await asyncio.to_thread(cluster.topic_id, "orders")
            assert stored == topic_id

        try:
            asyncio.run(create_across_the_drop())
        finally:
            cluster.client.stop()
            cluster.client.close()
