"""The documents' broker-side scenarios on three broker processes, replication factor 3:
followers held back with SIGSTOP, leaders lost to SIGKILL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from onceflow.faults.broker_process import paused
from onceflow.log.batch import decode_records, validate_batches
from onceflow.log.leader_epochs import LeaderEpochCheckpoint
from tests.cli.commands import onceflow
from tests.cluster_mode.conftest import BROKER_IDS, Cluster, create_assigned_topic, start_cluster
from tests.cluster_mode.test_zookeeper_cluster import create_topic
from tests.conftest import wait_until
from tests.wire import WireClient, make_batch, produce

pytestmark = pytest.mark.zookeeper


@pytest.fixture
def scenario_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Sessions of 4 s (the longest the test ZooKeeper allows), so that followers stopped for a
    moment keep theirs, and stay in the ISR (replica.lag.time.max.ms is 30 s)."""
    yield from start_cluster(tmp_path, {"zookeeper.session.timeout.ms": "4000"})


@contextmanager
def stopped(cluster: Cluster, broker_ids: list[int]) -> Iterator[None]:
    processes = [cluster.brokers[broker_id].process for broker_id in broker_ids]
    with paused([process for process in processes if process is not None]):
        yield


def fetch_log(address: str, topic: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record the partition's leader serves, up to its high watermark."""
    found: list[tuple[int, bytes]] = []
    with WireClient(address) as client:
        while True:
            offset = found[-1][0] + 1 if found else 0
            response = client.fetch({topic: [0]}, fetch_offset=offset)
            answer = response.responses[0].partitions[0]
            assert answer.error_code == ErrorCode.none
            records = bytes(answer.records or b"")
            if not records:
                return found
            position = 0
            for header in validate_batches(records):
                batch = records[position : position + header.size]
                position += header.size
                for index, record in enumerate(decode_records(batch)):
                    found.append((header.base_offset + index, bytes(record.value or b"")))


def write(cluster: Cluster, broker_id: int, topic: str, value: bytes, acks: int = -1) -> int:
    with WireClient(cluster.brokers[broker_id].bootstrap_servers) as client:
        return int(produce(client, topic, 0, make_batch([value]), acks=acks).error_code)


def failover(cluster: Cluster, topic: str, min_insync: str) -> tuple[int, list[int], list[bytes]]:
    """The documents' fault: the followers stop, the leader takes writes (answered or not by
    `acks`), the leader is SIGKILLed, the followers resume. Returns the old leader, the
    followers and the values the old leader acknowledged meanwhile."""
    create_topic(cluster, topic, 1, 3, **{"min.insync.replicas": min_insync})
    leader = cluster.wait_for_leader(topic).leader_id
    followers = [broker_id for broker_id in BROKER_IDS if broker_id != leader]
    for index in range(3):  # every replica has these
        assert write(cluster, leader, topic, b"before-%d" % index) == ErrorCode.none
    acknowledged = [b"before-%d" % index for index in range(3)]
    with stopped(cluster, followers):
        # A follower's long poll may still be answered with the first write: so several, one by
        # one, and the last ones are on the leader alone.
        with WireClient(cluster.brokers[leader].bootstrap_servers) as client:
            for index in range(5):
                value = b"during-%d" % index
                data = [{"index": 0, "records": make_batch([value])}]
                answer = client.request(
                    0,
                    9,
                    transactional_id=None,
                    acks=1 if min_insync == "1" else -1,
                    timeout=300,  # acks=all cannot be answered: the followers are stopped
                    topic_data=[{"name": topic, "partition_data": data}],
                )
                if answer.responses[0].partition_responses[0].error_code == ErrorCode.none:
                    acknowledged.append(value)
        cluster.brokers[leader].kill()
    return leader, followers, acknowledged


def test_acks_1_loses_what_only_the_killed_leader_had_and_its_log_is_truncated_on_return(
    scenario_cluster: Cluster,
) -> None:
    cluster = scenario_cluster
    old_leader, _, acknowledged = failover(cluster, "clicks", min_insync="1")
    assert len(acknowledged) == 3 + 5  # acks=1: the leader's append is enough
    new_leader = cluster.wait_for_leader("clicks", not_on=old_leader).leader_id
    # acks=all on the new leader: once answered, the high watermark covers its whole log.
    assert write(cluster, new_leader, "clicks", b"after") == ErrorCode.none
    survived = fetch_log(cluster.brokers[new_leader].bootstrap_servers, "clicks")
    values = [value for _, value in survived]
    assert values[-1] == b"after"
    lost = [value for value in acknowledged if value not in values]
    assert b"during-4" in lost  # acknowledged, and gone: the documents' acks=1 loss

    # The old leader comes back: it must cut its suffix (KIP-101), not keep it or copy anew.
    old_directory = cluster.brokers[old_leader].data_dir / "clicks-0"
    first_segment = next(iter(sorted(old_directory.glob("*.log"))))
    inode = first_segment.stat().st_ino
    cluster.brokers[old_leader].start()
    wait_until(lambda: old_leader in cluster.partition(new_leader, "clicks").isr_nodes, timeout_s=60)
    new_directory = cluster.brokers[new_leader].data_dir / "clicks-0"

    def same_log() -> bool:
        return _log_bytes(old_directory) == _log_bytes(new_directory)

    wait_until(same_log, timeout_s=30)
    assert first_segment.stat().st_ino == inode  # truncated in place, not emptied and copied
    wait_until(lambda: _same_epochs(old_directory, new_directory), timeout_s=30)  # each at its flush


def test_acks_all_with_min_insync_2_loses_nothing_acknowledged(scenario_cluster: Cluster) -> None:
    cluster = scenario_cluster
    old_leader, _, acknowledged = failover(cluster, "payments", min_insync="2")
    assert acknowledged == [b"before-%d" % index for index in range(3)]  # none while stopped
    new_leader = cluster.wait_for_leader("payments", not_on=old_leader).leader_id
    assert write(cluster, new_leader, "payments", b"after") == ErrorCode.none
    values = [value for _, value in fetch_log(cluster.brokers[new_leader].bootstrap_servers, "payments")]
    assert [value for value in acknowledged if value not in values] == []
    assert values[-1] == b"after"


def test_one_broker_of_three_refuses_acks_all_with_min_insync_2_and_takes_acks_1(cluster: Cluster) -> None:
    create_topic(cluster, "ledger", 1, 3, **{"min.insync.replicas": "2"})
    leader = cluster.wait_for_leader("ledger").leader_id
    for broker_id in BROKER_IDS:
        if broker_id != leader:
            cluster.brokers[broker_id].kill()
    wait_until(lambda: cluster.partition(leader, "ledger").isr_nodes == (leader,), timeout_s=60)
    assert write(cluster, leader, "ledger", b"all") == ErrorCode.not_enough_replicas
    assert write(cluster, leader, "ledger", b"one", acks=1) == ErrorCode.none

    result = onceflow("cluster", "status", "--zookeeper", cluster.zookeeper.connect_string, "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert [broker["id"] for broker in status["brokers"]] == [leader]
    assert {"topic": "ledger", "partition": 0, "leader": leader, "replicas": [1, 2, 3], "isr": [leader]} in [
        {**row, "replicas": sorted(row["replicas"])} for row in status["under_replicated_partitions"]
    ]


def test_acks_all_waiting_while_the_isr_shrinks_below_min_insync_gets_not_enough_after_append(
    tmp_path: Path,
) -> None:
    # The followers stall after the append; the leader drops them from the ISR after 1 s, which
    # moves its high watermark past the batch. Only the leader has it: no success (Kafka's
    # checkEnoughReplicasReachOffset), but NOT_ENOUGH_REPLICAS_AFTER_APPEND, which a client retries.
    cluster = next(
        clusters := start_cluster(
            tmp_path, {"replica.lag.time.max.ms": "1000", "zookeeper.session.timeout.ms": "4000"}
        )
    )
    try:
        create_topic(cluster, "ledger", 1, 3, **{"min.insync.replicas": "2"})
        leader = cluster.wait_for_leader("ledger").leader_id
        with WireClient(cluster.brokers[leader].bootstrap_servers, timeout_s=30) as client:
            assert produce(client, "ledger", 0, make_batch([b"in sync"])).error_code == ErrorCode.none
            with stopped(cluster, [broker_id for broker_id in BROKER_IDS if broker_id != leader]):
                answer = produce(client, "ledger", 0, make_batch([b"only on the leader"]))
                isr = cluster.partition(leader, "ledger").isr_nodes
        assert isr == (leader,)  # the precondition: the ISR did shrink while the produce waited
        assert answer.error_code == ErrorCode.not_enough_replicas_after_append
    finally:
        clusters.close()


def _log_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def _same_epochs(one: Path, other: Path) -> bool:
    """Whether both partition directories' leader-epoch checkpoints hold the same epochs."""
    epochs = [LeaderEpochCheckpoint(directory).read() for directory in (one, other)]
    return bool(epochs[0].entries) and epochs[0] == epochs[1]


def test_an_unclean_election_truncates_what_only_the_old_leader_had_and_a_clean_one_waits_for_it(
    quick_lag_cluster: Cluster,
) -> None:
    """The ISR shrinks to the leader alone (followers stopped), it takes writes and dies. Where
    unclean election is allowed a stale follower leads, and the old leader cuts its extra records
    when it returns; where not, the partition waits offline for it and loses nothing."""
    cluster = quick_lag_cluster
    for name, unclean in [("risky", "true"), ("safe", "false")]:  # both led by 1
        create_assigned_topic(cluster, name, [1, 2, 3], {"unclean.leader.election.enable": unclean})
    for topic in ("risky", "safe"):
        assert cluster.wait_for_leader(topic).leader_id == 1
        assert write(cluster, 1, topic, b"everywhere") == ErrorCode.none
    with stopped(cluster, [2, 3]):
        for topic in ("risky", "safe"):
            wait_until(lambda topic=topic: cluster.partition(1, topic).isr_nodes == (1,), timeout_s=30)
            for value in (b"only-on-1-a", b"only-on-1-b"):
                assert write(cluster, 1, topic, value) == ErrorCode.none  # acks=all: the ISR is 1 alone
        before = cluster.partition(1, "risky")
        cluster.brokers[1].kill()

    risky = cluster.wait_for_leader("risky", not_on=1)
    assert risky.leader_epoch > before.leader_epoch  # the new leader's batches carry a new epoch
    risky_leader = risky.leader_id
    assert write(cluster, risky_leader, "risky", b"after") == ErrorCode.none
    values = [value for _, value in fetch_log(cluster.brokers[risky_leader].bootstrap_servers, "risky")]
    assert values == [b"everywhere", b"after"]  # two acknowledged records lost
    # The controller's news of the other partition may reach this broker a moment later.
    offline = (-1, (1,))
    wait_until(lambda: _leader_and_isr(cluster.partition(risky_leader, "safe")) == offline, timeout_s=30)
    assert write(cluster, risky_leader, "safe", b"refused", acks=1) == ErrorCode.not_leader_or_follower

    wait_until(lambda: 1 not in [broker.node_id for broker in cluster.metadata(2).brokers], timeout_s=60)
    cluster.brokers[1].start()
    assert cluster.wait_for_leader("safe").leader_id == 1
    safe_values = [value for _, value in fetch_log(cluster.brokers[1].bootstrap_servers, "safe")]
    assert safe_values == [b"everywhere", b"only-on-1-a", b"only-on-1-b"]
    wait_until(lambda: 1 in cluster.partition(risky_leader, "risky").isr_nodes, timeout_s=60)
    old, new = (cluster.brokers[broker_id].data_dir / "risky-0" for broker_id in (1, risky_leader))
    wait_until(lambda: _log_bytes(old) == _log_bytes(new), timeout_s=30)  # the extra records are cut
    wait_until(lambda: _same_epochs(old, new), timeout_s=30)


def _leader_and_isr(partition: Any) -> tuple[int, tuple[int, ...]]:
    return partition.leader_id, tuple(partition.isr_nodes)
