"""A transaction whose partitions three different brokers lead: the coordinator (the lowest
broker id) sends each leader its markers with WriteTxnMarkers, and commits only once every
leader's ISR has them."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from tests.cluster_mode.conftest import BROKER_IDS, Cluster, create_topic_with_assignments
from tests.support import read_to_end

pytestmark = pytest.mark.zookeeper

TOPIC = "spread"
# Partition i led by broker i + 1: one partition on the coordinator, two on the others.
ASSIGNMENTS = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
ROUNDS = 6
PER_PARTITION = 4


def by_partition(bootstrap: str, isolation: str) -> dict[int, list[str]]:
    read = read_to_end(bootstrap, TOPIC, len(ASSIGNMENTS), isolation=isolation)
    return {partition: [record.value for record in read[partition]] for partition in range(len(ASSIGNMENTS))}


def test_a_transaction_spans_partitions_led_by_every_broker(cluster: Cluster) -> None:
    create_topic_with_assignments(cluster, TOPIC, ASSIGNMENTS, {"min.insync.replicas": "2"})
    leaders = {cluster.wait_for_leader(TOPIC, partition).leader_id for partition in range(len(ASSIGNMENTS))}
    assert leaders == set(BROKER_IDS)

    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": "spread-1"})
    producer.init_transactions(30)
    committed: dict[int, list[str]] = {partition: [] for partition in range(len(ASSIGNMENTS))}
    aborted: set[str] = set()
    for round_ in range(ROUNDS):
        commit = round_ % 2 == 0
        producer.begin_transaction()
        for partition in range(len(ASSIGNMENTS)):
            for index in range(PER_PARTITION):
                value = f"{'c' if commit else 'a'}{round_}-p{partition}-{index}"
                producer.produce(TOPIC, value=value, partition=partition)
                if commit:
                    committed[partition].append(value)
                else:
                    aborted.add(value)
        if commit:
            producer.commit_transaction(30)
        else:
            assert producer.flush(30) == 0  # sent, not purged: the abort has records to skip
            producer.abort_transaction(30)

    # The aborted records are in the logs (else nothing below tests skipping them) ...
    everything = by_partition(cluster.bootstrap_servers, "read_uncommitted")
    assert aborted <= {value for values in everything.values() for value in values}
    # ... and read_committed skips them on every leader, which has every marker (a missing one
    # would hold its partition's LSO at the transaction's first record).
    assert by_partition(cluster.bootstrap_servers, "read_committed") == committed

    # The commit was answered once each leader's ISR had the markers: a new leader has them too.
    cluster.brokers[3].kill()
    cluster.wait_for_leader(TOPIC, 2, not_on=3)
    assert by_partition(cluster.bootstrap_servers, "read_committed") == committed
