"""Failover under load: an idempotent `acks=all` producer keeps writing while brokers, one at a
time, are SIGKILLed and started again. Nothing acknowledged may be lost, duplicated or reordered,
and the replicas must end up byte-identical up to the high watermark."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from onceflow.log.batch import validate_batches
from tests.cluster_mode.conftest import BROKER_IDS, Cluster
from tests.cluster_mode.test_zookeeper_cluster import create_topic
from tests.conftest import wait_until

pytestmark = [pytest.mark.zookeeper, pytest.mark.soak]

# ONCEFLOW_SOAK_S=600 for a longer run; ONCEFLOW_SOAK_SEED picks another kill schedule.
SOAK_S = float(os.environ.get("ONCEFLOW_SOAK_S", "60"))
SEED = int(os.environ.get("ONCEFLOW_SOAK_SEED", "11"))
TOPIC = "orders"
PARTITIONS = 3
# A steady load that a busy 2-core machine sustains and reads back in seconds.
RECORDS_PER_S = 500


def registered(cluster: Cluster, asked: int) -> set[int]:
    return {broker.node_id for broker in cluster.metadata(asked).brokers}


def bounce(cluster: Cluster, victim: int) -> None:
    witness = next(broker_id for broker_id in BROKER_IDS if broker_id != victim)
    cluster.brokers[victim].kill()
    # Its ephemeral registration outlives it by a session timeout; until then it cannot rejoin.
    wait_until(lambda: victim not in registered(cluster, witness), timeout_s=30)
    cluster.brokers[victim].start()
    wait_until(lambda: victim in registered(cluster, witness), timeout_s=30)


def kill_and_restart(cluster: Cluster, stop: threading.Event, kills: list[int]) -> None:
    """SIGKILL a seeded-random broker every few seconds; the next only once the last one has
    registered again, so at most one is ever down."""
    chooser = random.Random(SEED)
    next_kill = time.monotonic() + chooser.uniform(1, 4)
    while not stop.wait(max(0.0, next_kill - time.monotonic())):
        victim = chooser.choice(BROKER_IDS)
        kills.append(victim)
        bounce(cluster, victim)
        next_kill = time.monotonic() + chooser.uniform(1, 4)


def produce_for(cluster: Cluster, seconds: float) -> tuple[list[tuple[int, int, bytes]], list[str]]:
    """(partition, offset, value) of each acknowledged record, in the order produced, and
    every delivery failure or fatal producer error."""
    acknowledged: list[tuple[int, int, bytes]] = []
    failures: list[str] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failures.append(f"{message.value()!r}: {error}")
        else:
            acknowledged.append((message.partition(), message.offset(), message.value()))

    def on_error(error: KafkaError) -> None:
        if error.fatal():
            failures.append(f"fatal: {error}")

    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 0,  # retry for as long as it takes: losses are what we look for
            "error_cb": on_error,
        }
    )
    start = time.monotonic()
    sequence = 0
    while (now := time.monotonic()) < start + seconds and not failures:
        due = start + sequence / RECORDS_PER_S
        if now < due:
            producer.poll(due - now)  # serves delivery reports while it paces
            continue
        value = b"%08d" % sequence
        producer.produce(TOPIC, value, partition=sequence % PARTITIONS, on_delivery=delivered)
        sequence += 1
    assert producer.flush(60) == 0, "records still unanswered a minute after the run"
    return acknowledged, failures


def read_back(cluster: Cluster) -> tuple[dict[int, list[tuple[int, bytes]]], dict[int, int]]:
    """(offset, value) of every record of each partition, up to its high watermark, and the
    high watermarks."""
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "audit", "enable.auto.commit": False}
    )
    try:
        logs: dict[int, list[tuple[int, bytes]]] = {}
        high_watermarks: dict[int, int] = {}
        for partition in range(PARTITIONS):
            _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=30)
            consumer.assign([TopicPartition(TOPIC, partition, 0)])
            found: list[tuple[int, bytes]] = []

            def read_to_high(found: list[tuple[int, bytes]] = found, high: int = high) -> bool:
                for message in consumer.consume(500, 0.5):
                    assert message.error() is None, message.error()
                    found.append((message.offset(), message.value()))
                return (found[-1][0] + 1 if found else 0) >= high

            wait_until(read_to_high, timeout_s=60)
            logs[partition] = found
            high_watermarks[partition] = high
        return logs, high_watermarks
    finally:
        consumer.close()


def batches_below(directory: Path, high_watermark: int) -> list[bytes]:
    """The stored bytes of each batch in a replica's segment files that starts below the high
    watermark."""
    data = b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))
    batches, position = [], 0
    for header in validate_batches(data):
        if header.base_offset < high_watermark:
            batches.append(data[position : position + header.size])
        position += header.size
    return batches


def test_an_idempotent_acks_all_producer_loses_duplicates_and_reorders_nothing_while_brokers_die(
    cluster: Cluster,
) -> None:
    create_topic(cluster, TOPIC, PARTITIONS, 3, **{"min.insync.replicas": "2"})
    for partition in range(PARTITIONS):
        cluster.wait_for_leader(TOPIC, partition)

    stop, kills = threading.Event(), []
    errors: list[BaseException] = []

    def chaos() -> None:
        try:
            kill_and_restart(cluster, stop, kills)
        except BaseException as error:  # re-raised on the test's thread
            errors.append(error)

    killer = threading.Thread(target=chaos, name="killer", daemon=True)
    killer.start()
    try:
        acknowledged, failures = produce_for(cluster, SOAK_S)
    finally:
        stop.set()
        killer.join(timeout=90)
    assert not errors, errors
    assert len(cluster.live()) == len(BROKER_IDS)
    assert kills, "no broker was killed"
    assert failures == [], f"seed {SEED}, kills {kills}: {failures[:5]}"

    logs, high_watermarks = read_back(cluster)
    where = f"seed {SEED}, kills {kills}"
    stored = {(partition, offset): value for partition, log in logs.items() for offset, value in log}
    lost = [record for record in acknowledged if stored.get(record[:2]) != record[2]]
    assert lost == [], f"{where}: {len(lost)} acknowledged records lost, first {lost[:5]}"
    values = [value for log in logs.values() for _, value in log]
    duplicated = sorted(value for value, count in Counter(values).items() if count > 1)
    assert duplicated == [], f"{where}: duplicated {duplicated[:5]}"
    for partition, log in logs.items():
        sequences = [int(value) for _, value in log]
        assert sequences == sorted(sequences), f"{where}: partition {partition} out of order"

    # Every replica back in sync, then stopped: their files must agree up to the high watermark.
    for partition in range(PARTITIONS):
        wait_until(
            lambda partition=partition: len(cluster.partition(1, TOPIC, partition).isr_nodes) == 3,
            timeout_s=60,
        )
    for broker in cluster.brokers.values():
        broker.terminate()
    for partition, high_watermark in high_watermarks.items():
        replicas = {
            broker_id: batches_below(broker.data_dir / f"{TOPIC}-{partition}", high_watermark)
            for broker_id, broker in cluster.brokers.items()
        }
        assert replicas[1] == replicas[2] == replicas[3], f"{where}: partition {partition} diverged"
