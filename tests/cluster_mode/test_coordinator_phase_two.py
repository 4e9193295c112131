"""Phase two of a transaction across a coordinator failover.

- The coordinator's broker is SIGKILLed between PrepareCommit (committed to the ISR of its
  `__transaction_state` partition) and the markers: the partition's new leader loads the
  prepared transaction and completes the commit on every partition (each at its current leader).
- The coordinator is paused (held at that step, then SIGSTOPped) across its partition's leadership
  change, then resumed: its markers carry the old coordinator epoch and every partition refuses
  them (TRANSACTION_COORDINATOR_FENCED), its offset commit is not applied, and the transactions
  end as the new coordinator decides. The negative control (`markers.unfenced`: partitions take
  any coordinator's markers) lets the paused coordinator's stale COMMIT end the producer's next
  transaction, whose aborted records read_committed consumers then read.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from onceflow import failpoints
from tests.broker.test_metrics import scrape, total
from tests.cluster_mode.conftest import (
    BROKER_IDS,
    TRANSACTION_KEY,
    Cluster,
    create_topic_with_assignments,
    start_cluster,
)
from tests.conftest import wait_until
from tests.groups.helpers import commit, fetch
from tests.support import read_to_end
from tests.wire import WireClient

pytestmark = pytest.mark.zookeeper

ARMED = 1  # the broker with the crash failpoint armed
HOLD = "txn.hold-after-prepare"
RECORDS = 3  # per partition and transaction


@pytest.fixture
def crashing_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Broker 1 SIGKILLs itself once a transaction it coordinates is PrepareCommit."""
    yield from start_cluster(tmp_path, envs={ARMED: {"ONCEFLOW_FAILPOINTS": "txn.after-prepare"}})


def transactional_id_on(cluster: Cluster, broker_id: int, prefix: str) -> str:
    """A transactional id that `broker_id` coordinates."""
    cluster.wait_for_coordinator(f"{prefix}-0", TRANSACTION_KEY)  # __transaction_state exists
    candidates = (f"{prefix}-{n}" for n in range(500))
    return next(tid for tid in candidates if cluster.coordinator(tid, TRANSACTION_KEY) == broker_id)


def led_by(cluster: Cluster, topic: str, leaders: list[int]) -> None:
    """Partition i led by `leaders[i]`, with 3 replicas and min.insync.replicas 2."""
    assignments = [[leader, *(b for b in BROKER_IDS if b != leader)] for leader in leaders]
    create_topic_with_assignments(cluster, topic, assignments, {"min.insync.replicas": "2"})
    for partition in range(len(leaders)):
        cluster.wait_for_leader(topic, partition)


def produce_all(producer: Producer, topic: str, partitions: int, tag: str) -> set[str]:
    written = {f"{tag}-{partition}-{n}" for partition in range(partitions) for n in range(RECORDS)}
    for value in sorted(written):
        producer.produce(topic, value=value, partition=int(value.split("-")[-2]))
    assert producer.flush(30) == 0
    return written


def read_committed(cluster: Cluster, topic: str, partitions: int) -> set[str]:
    read = read_to_end(cluster.bootstrap_servers, topic, partitions, isolation="read_committed")
    return {record.value for records in read.values() for record in records}


def stable(cluster: Cluster, topic: str, partitions: int) -> bool:
    """Whether every partition's last stable offset is its high watermark: no transaction open."""
    for partition in range(partitions):
        leader = cluster.partition(next(iter(cluster.live())), topic, partition).leader_id
        if leader not in cluster.live():
            return False
        with WireClient(cluster.brokers[leader].bootstrap_servers) as client:
            if client.list_offset(topic, partition, isolation_level=1) != client.list_offset(
                topic, partition
            ):
                return False
    return True


def test_a_commit_prepared_when_the_coordinator_dies_completes_on_every_partition(
    crashing_cluster: Cluster,
) -> None:
    cluster = crashing_cluster
    transactional_id = transactional_id_on(cluster, ARMED, "prepared")
    led_by(cluster, "spread", list(BROKER_IDS))  # one partition on the doomed coordinator
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": transactional_id}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    written = produce_all(producer, "spread", len(BROKER_IDS), "prepared")
    committing = threading.Thread(target=producer.commit_transaction, args=(120,), daemon=True)
    committing.start()
    doomed = cluster.brokers[ARMED].process
    assert doomed is not None
    doomed.wait(timeout=60)
    assert doomed.returncode == -signal.SIGKILL  # it died at the failpoint, PrepareCommit committed
    assert cluster.wait_for_coordinator(transactional_id, TRANSACTION_KEY, not_on=ARMED) != ARMED
    wait_until(lambda: stable(cluster, "spread", len(BROKER_IDS)), timeout_s=60)
    assert read_committed(cluster, "spread", len(BROKER_IDS)) == written
    committing.join(timeout=120)  # the producer's retried EndTxn found the commit done
    assert not committing.is_alive()


@dataclass
class Paused:
    visible: set[str]  # what read_committed readers see of the two transactions
    committed_before: set[str]
    aborted_after: set[str]
    fenced_markers: int  # the paused coordinator's markers the partitions refused
    stale_commit: ErrorCode  # its answer to an offset commit once resumed
    offset_after: int  # the group's offset, from its new coordinator


def pause_the_coordinator_across_a_failover(tmp_path: Path, unfenced: bool) -> Paused:
    armed = HOLD + (",markers.unfenced" if unfenced else "")
    env = {"ONCEFLOW_FAILPOINTS": armed, "ONCEFLOW_FAILPOINT_DIR": str(tmp_path)}
    clusters = start_cluster(tmp_path / "cluster", envs=dict.fromkeys(BROKER_IDS, env), metrics=True)
    cluster = next(clusters)
    try:
        return _pause(cluster, tmp_path)
    finally:
        clusters.close()


def _pause(cluster: Cluster, failpoint_dir: Path) -> Paused:
    paused_id = cluster.wait_for_coordinator("paused-0", TRANSACTION_KEY)
    transactional_id = transactional_id_on(cluster, paused_id, "paused")
    cluster.wait_for_coordinator("group-0")  # __consumer_offsets exists
    group = next(f"group-{n}" for n in range(500) if cluster.coordinator(f"group-{n}") == paused_id)
    others = [broker_id for broker_id in BROKER_IDS if broker_id != paused_id]
    led_by(cluster, "fenced", others)  # the markers go to the other two brokers
    with WireClient(cluster.brokers[paused_id].bootstrap_servers) as client:
        assert commit(client, group, {("fenced", 0): 5}) == {("fenced", 0): ErrorCode.none}

    # Its EndTxn to the paused coordinator is given up after 5 s (not librdkafka's 60) and retried.
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "transactional.id": transactional_id,
            "socket.timeout.ms": 5000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    committed_before = produce_all(producer, "fenced", len(others), "before")
    outcome: list[BaseException | None] = []
    committing = threading.Thread(target=lambda: outcome.append(_commit(producer)), daemon=True)
    committing.start()
    # Held between its PrepareCommit (committed) and the markers, then paused altogether: its
    # ZooKeeper session ends, and its partitions get new leaders.
    held = failpoint_dir / HOLD
    wait_until(lambda: held.exists() and held.read_text() != "", timeout_s=60)
    paused = cluster.brokers[paused_id].process
    assert paused is not None and int(held.read_text()) == paused.pid
    urls = [cluster.brokers[broker_id].metrics_url or "" for broker_id in others]
    os.kill(paused.pid, signal.SIGSTOP)
    cluster.brokers[paused_id].process = None  # not live, for the helpers
    try:
        cluster.wait_for_coordinator(transactional_id, TRANSACTION_KEY, not_on=paused_id)
        committing.join(timeout=120)  # the new coordinator completed the commit
        assert outcome == [None]
        producer.begin_transaction()  # the producer's next transaction, open on both partitions
        aborted_after = produce_all(producer, "fenced", len(others), "after")
        answered = sum(_markers_answered(url) for url in urls)
        fenced = sum(_markers_fenced(url) for url in urls)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        cluster.brokers[paused_id].process = paused
        failpoints.release(failpoint_dir, HOLD)
    # The resumed coordinator sends its markers for the first transaction, with its old epoch.
    wait_until(lambda: sum(_markers_answered(url) for url in urls) >= answered + len(others), timeout_s=60)
    fenced_markers = int(sum(_markers_fenced(url) for url in urls) - fenced)
    with WireClient(cluster.brokers[paused_id].bootstrap_servers, timeout_s=30) as client:
        stale_commit = commit(client, group, {("fenced", 0): 99})[("fenced", 0)]
    producer.abort_transaction(60)  # as the new coordinator decides
    new_coordinator = cluster.wait_for_coordinator(group, not_on=paused_id)
    with WireClient(cluster.brokers[new_coordinator].bootstrap_servers) as client:
        offset_after = fetch(client, group, [("fenced", 0)])[("fenced", 0)][0]
    wait_until(lambda: stable(cluster, "fenced", len(others)), timeout_s=60)
    visible = read_committed(cluster, "fenced", len(others))
    return Paused(visible, committed_before, aborted_after, fenced_markers, stale_commit, offset_after)


def _commit(producer: Producer) -> BaseException | None:
    try:
        producer.commit_transaction(120)
    except BaseException as error:
        return error
    return None


def _markers_answered(url: str) -> float:
    return total(scrape(url), "kafka_network_requestmetrics_errors_total", request="WriteTxnMarkers")


def _markers_fenced(url: str) -> float:
    samples = scrape(url)
    return total(samples, "kafka_network_requestmetrics_errors_total", error="TRANSACTION_COORDINATOR_FENCED")


def test_a_paused_coordinator_resumed_after_its_failover_changes_nothing(tmp_path: Path) -> None:
    paused = pause_the_coordinator_across_a_failover(tmp_path, unfenced=False)
    # Every partition refused its markers (a retry sent before it learns of its failover, as on a
    # loaded machine, is refused again).
    assert paused.fenced_markers >= 2
    assert paused.visible == paused.committed_before  # the second transaction stays aborted
    assert paused.stale_commit != ErrorCode.none and paused.offset_after == 5


def test_control_without_the_coordinator_epoch_check_the_stale_commit_ends_the_next_transaction(
    tmp_path: Path,
) -> None:
    paused = pause_the_coordinator_across_a_failover(tmp_path, unfenced=True)
    assert paused.fenced_markers == 0
    assert paused.aborted_after <= paused.visible  # aborted records, read as committed
