"""A ZooKeeper server and three `onceflow broker --zookeeper` processes that form a cluster."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from onceflow.cluster.zookeeper_server import ZooKeeperServer
from tests.conftest import BrokerProcess, wait_until
from tests.wire import WireClient

BROKER_IDS = (1, 2, 3)
GROUP_KEY, TRANSACTION_KEY = 0, 1  # FindCoordinator's key types
# A SIGKILLed broker's session, and so its leaderships, end within 4 s, the longest the test
# ZooKeeper allows. With 2 s, a stall of the machine of about 3 s (two CI runs on 2026-11-29)
# ended the surviving brokers' sessions too, and with them their ISR memberships.
SETTINGS = {"zookeeper.session.timeout.ms": "4000", "default.replication.factor": "3"}


@dataclass
class Cluster:
    zookeeper: ZooKeeperServer
    brokers: dict[int, BrokerProcess]

    def live(self) -> dict[int, BrokerProcess]:
        return {
            broker_id: broker
            for broker_id, broker in self.brokers.items()
            if broker.process is not None and broker.process.poll() is None
        }

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(broker.bootstrap_servers for broker in self.live().values())

    def metadata(self, broker_id: int, *topics: str, auto_create: bool = False) -> Any:
        """Metadata v12 from one broker, straight off the wire."""
        with WireClient(self.brokers[broker_id].bootstrap_servers) as client:
            return client.request(
                3,
                12,
                topics=[{"topic_id": None, "name": topic} for topic in topics],
                allow_auto_topic_creation=auto_create,
                include_topic_authorized_operations=False,
            )

    def coordinator(self, key: str, key_type: int = GROUP_KEY) -> int:
        """The broker FindCoordinator names for `key` (asked of a live broker), -1 while none."""
        with WireClient(self.bootstrap_servers.split(",")[-1]) as client:
            found = client.request(10, 4, key_type=key_type, coordinator_keys=[key])
        return int(found.coordinators[0].node_id)

    def wait_for_coordinator(self, key: str, key_type: int = GROUP_KEY, not_on: int | None = None) -> int:
        """The live broker that coordinates `key`, once there is one other than `not_on`."""
        wait_until(lambda: self.coordinator(key, key_type) not in (-1, not_on), timeout_s=60)
        return self.coordinator(key, key_type)

    def partition(self, broker_id: int, topic: str, partition: int = 0) -> Any:
        return self.metadata(broker_id, topic).topics[0].partitions[partition]

    def wait_for_leader(self, topic: str, partition: int = 0, not_on: int | None = None) -> Any:
        """The partition's metadata once a live broker other than `not_on` leads it, as every
        live broker sees it."""
        live = self.live()

        def led() -> bool:
            seen = [self.metadata(broker_id, topic).topics[0] for broker_id in live]
            return all(
                described.error_code == 0
                and described.partitions[partition].leader_id in live
                and described.partitions[partition].leader_id != not_on
                and described.partitions[partition] == seen[0].partitions[partition]
                for described in seen
            )

        wait_until(led, timeout_s=60)
        return self.partition(next(iter(live)), topic, partition)


def create_assigned_topic(
    cluster: Cluster, name: str, replicas: list[int], configs: dict[str, str] | None = None
) -> None:
    """One partition on `replicas`, the first its preferred leader (CreateTopics assignments)."""
    create_topic_with_assignments(cluster, name, [replicas], configs)


def create_topic_with_assignments(
    cluster: Cluster, name: str, assignments: list[list[int]], configs: dict[str, str] | None = None
) -> None:
    """Partition i on `assignments[i]`, the first its preferred leader."""
    with WireClient(cluster.brokers[BROKER_IDS[-1]].bootstrap_servers) as client:
        create_topic_at(client, name, assignments, configs)


def create_topic_at(
    client: WireClient, name: str, assignments: list[list[int]], configs: dict[str, str] | None = None
) -> None:
    """`create_topic_with_assignments` through a connection of the caller's."""
    created = client.request(
        19,
        7,
        topics=[
            {
                "name": name,
                "num_partitions": -1,
                "replication_factor": -1,
                "assignments": [
                    {"partition_index": index, "broker_ids": replicas}
                    for index, replicas in enumerate(assignments)
                ],
                "configs": [{"name": key, "value": value} for key, value in (configs or {}).items()],
            }
        ],
        timeout=20_000,
        validate_only=False,
    )
    assert created.topics[0].error_code == 0, created.topics[0].error_message


def start_cluster(
    directory: Path,
    settings: dict[str, str] | None = None,
    envs: Mapping[int, dict[str, str]] | None = None,
    metrics: bool = False,
) -> Iterator[Cluster]:
    """`envs`: each broker's environment (failpoints), by id; `metrics`: each serves /metrics."""
    with ZooKeeperServer() as zookeeper:
        brokers = {}
        for broker_id in BROKER_IDS:
            broker = BrokerProcess(
                directory / f"broker-{broker_id}",
                settings={**SETTINGS, **(settings or {})},
                env=(envs or {}).get(broker_id),
            )
            broker.extra_args = ["--zookeeper", zookeeper.connect_string, "--broker-id", str(broker_id)]
            if metrics:
                broker.extra_args += ["--metrics", "127.0.0.1:0"]
            brokers[broker_id] = broker
        try:
            with ThreadPoolExecutor(len(brokers)) as pool:
                list(pool.map(BrokerProcess.start, brokers.values()))
            running = Cluster(zookeeper, brokers)
            # Each broker's view follows ZooKeeper's a little later; until every broker knows
            # every other, one may refuse an assignment that names a broker it has not seen.
            wait_until(
                lambda: all(len(running.metadata(i).brokers) == len(BROKER_IDS) for i in BROKER_IDS),
                timeout_s=60,
            )
            yield running
        finally:
            for broker in brokers.values():
                if broker.process is not None and broker.process.poll() is None:
                    broker.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of its own, for a test that kills brokers."""
    yield from start_cluster(tmp_path)


@pytest.fixture
def quick_lag_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Leaders drop a silent follower from the ISR after 1 s, well before its session (4 s, the
    longest the test ZooKeeper allows) ends."""
    yield from start_cluster(
        tmp_path, {"replica.lag.time.max.ms": "1000", "zookeeper.session.timeout.ms": "4000"}
    )


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests that kill nothing (each uses topics of its own)."""
    yield from start_cluster(tmp_path_factory.mktemp("cluster"))
