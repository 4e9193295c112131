"""Soak: exactly-once and acks=all on 3 brokers while a broker, coordinators included, is SIGKILLed
and started again every ~15 s.

Each killed broker stays down for half the interval, long enough for its partitions, the
coordinators' too, to fail over. An exactly-once pipeline (two journaled workers,
tests/cluster_mode/journaled_worker.py, whose group and transactional ids have their coordinators
among the brokers killed) and an idempotent acks=all producer run side by side. At the end: no
input record lost or transformed twice, no record of an aborted transaction read with
read_committed, no acknowledged record lost, duplicated or reordered, and every replica of every
partition, the coordinators' own included, byte-identical up to the high watermark.

`ONCEFLOW_COORDINATOR_SOAK_S` sets the duration: 25 s here (a kill every ~8 s), 150 s in
`make soak` (a kill every ~15 s); `ONCEFLOW_SOAK_SEED` another kill schedule.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.cluster_mode.conftest import BROKER_IDS, TRANSACTION_KEY, Cluster, start_cluster
from tests.cluster_mode.test_failover_under_load import (
    PARTITIONS as ORDER_PARTITIONS,
)
from tests.cluster_mode.test_failover_under_load import (
    TOPIC as ORDERS,
)
from tests.cluster_mode.test_failover_under_load import (
    batches_below,
    produce_for,
    read_back,
    registered,
)
from tests.cluster_mode.test_zookeeper_cluster import create_topic
from tests.conftest import wait_until
from tests.support import read_to_end

pytestmark = [pytest.mark.zookeeper, pytest.mark.soak]

SOAK_S = float(os.environ.get("ONCEFLOW_COORDINATOR_SOAK_S", "25"))
SEED = int(os.environ.get("ONCEFLOW_SOAK_SEED", "37"))
KILL_EVERY_S = min(15.0, SOAK_S / 3)
INPUTS_PER_S = 100
PARTITIONS = 4
GROUP = "soak"
# Fewer internal partitions than Kafka's 50, so that the replicas converge quickly at the end
# (tests/cluster_mode/test_coordinator_failover.py runs with 50); no cleaner, so that the
# replicas' bytes can be compared.
SETTINGS = {
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.num.partitions": "10",
    "log.cleaner.enable": "false",
}
INTERNAL_TOPICS = {"__consumer_offsets": 10, "__transaction_state": 10}


@pytest.fixture
def soak_cluster(tmp_path: Path) -> object:
    yield from start_cluster(tmp_path / "cluster", SETTINGS)


def down(cluster: Cluster, victim: int, seconds: float) -> None:
    """SIGKILL `victim`, keep it down for `seconds` after its registration is gone (so that its
    partitions, the coordinators' among them, fail over), then start it again."""
    witness = next(broker_id for broker_id in BROKER_IDS if broker_id != victim)
    cluster.brokers[victim].kill()
    wait_until(lambda: victim not in registered(cluster, witness), timeout_s=30)
    time.sleep(seconds)  # the fault itself: the broker stays down this long
    cluster.brokers[victim].start()
    wait_until(lambda: victim in registered(cluster, witness), timeout_s=30)


def coordinators(cluster: Cluster, transactional_ids: list[str]) -> set[int]:
    return {cluster.coordinator(GROUP)} | {
        cluster.coordinator(tid, TRANSACTION_KEY) for tid in transactional_ids
    }


def feed(bootstrap: str, seconds: float, count: list[int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        while count[0] < elapsed * INPUTS_PER_S:
            producer.produce("input", key=str(count[0]), value=f"in-{count[0]}")
            count[0] += 1
        producer.poll(0.05)
    assert producer.flush(120) == 0


def committed_total(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        partitions = consumer.committed([TopicPartition("input", p) for p in range(PARTITIONS)], timeout=5)
    except Exception:
        return -1
    finally:
        consumer.close()
    return sum(max(partition.offset, 0) for partition in partitions)


def high_watermarks(cluster: Cluster, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "audit"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def test_exactly_once_and_acks_all_survive_brokers_and_coordinators_dying(
    soak_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = soak_cluster
    for topic in ("input", "output"):
        create_topic(cluster, topic, PARTITIONS, 3, **{"min.insync.replicas": "2"})
    create_topic(cluster, ORDERS, ORDER_PARTITIONS, 3, **{"min.insync.replicas": "2"})
    cluster.wait_for_coordinator(GROUP)
    cluster.wait_for_coordinator("soak-0", TRANSACTION_KEY)
    transactional_ids = ["soak-0", "soak-1"]
    bootstrap = ",".join(broker.bootstrap_servers for broker in cluster.brokers.values())
    journals = [tmp_path / f"journal-{slot}" for slot in range(2)]
    workers_stop, chaos_stop = threading.Event(), threading.Event()
    restarts = [0]

    def supervise() -> None:
        """Each worker started again whenever it exits (it exits on any error)."""
        workers: list[subprocess.Popen[bytes] | None] = [None, None]
        while not workers_stop.wait(0.2):
            for slot, worker in enumerate(workers):
                if worker is None or worker.poll() is not None:
                    restarts[0] += worker is not None
                    command = [sys.executable, "-m", "tests.cluster_mode.journaled_worker", bootstrap, GROUP]
                    command += [transactional_ids[slot], str(journals[slot])]
                    workers[slot] = subprocess.Popen(
                        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
        for worker in workers:
            if worker is not None:
                worker.kill()
                worker.wait(timeout=10)

    kills: list[tuple[int, bool]] = []  # (victim, whether it coordinated the pipeline then)
    errors: list[BaseException] = []

    def chaos() -> None:
        chooser = random.Random(SEED)
        try:
            while not chaos_stop.wait(chooser.uniform(0.7, 1.3) * KILL_EVERY_S):
                held = coordinators(cluster, transactional_ids) - {-1}
                # The first kill takes a coordinator of the pipeline; the others fall where they may.
                victim = min(held) if not kills and held else chooser.choice(BROKER_IDS)
                kills.append((victim, victim in held))
                down(cluster, victim, KILL_EVERY_S / 2)
        except BaseException as error:  # re-raised on the test's thread
            errors.append(error)

    inputs = [0]
    threads = [
        threading.Thread(target=supervise, daemon=True),
        threading.Thread(target=chaos, daemon=True),
        threading.Thread(target=feed, args=(bootstrap, SOAK_S, inputs), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        try:
            acknowledged, failures = produce_for(cluster, SOAK_S)
            threads[2].join(timeout=180)
        finally:
            chaos_stop.set()
            threads[1].join(timeout=120)
        assert not errors, errors
        where = f"seed {SEED}, kills {kills}"
        assert any(coordinated for _, coordinated in kills), f"{where}: no coordinator was killed"
        wait_until(lambda: len(cluster.live()) == len(BROKER_IDS), timeout_s=60)
        # The pipeline catches up: every input's offset committed.
        wait_until(lambda: committed_total(bootstrap) >= inputs[0], timeout_s=180)
    finally:
        workers_stop.set()
        threads[0].join(timeout=30)

    # acks=all: nothing acknowledged lost, duplicated or reordered.
    assert failures == [], f"{where}: {failures[:5]}"
    logs, order_watermarks = read_back(cluster)
    stored = {(partition, offset): value for partition, log in logs.items() for offset, value in log}
    lost = [record for record in acknowledged if stored.get(record[:2]) != record[2]]
    assert lost == [], f"{where}: {len(lost)} acknowledged records lost, first {lost[:5]}"
    order_values = [value for log in logs.values() for _, value in log]
    assert not [v for v, n in Counter(order_values).items() if n > 1], f"{where}: duplicated orders"

    # Exactly once: every input once in the read_committed output, no aborted record read.
    outcomes = dict(
        reversed(line.split())
        for journal in journals
        if journal.exists()
        for line in journal.read_text().splitlines()
    )
    read = read_to_end(bootstrap, "output", PARTITIONS, "read_committed")
    committed_output = [record.value for records in read.values() for record in records]
    by_input = Counter(value.rsplit(":", 1)[0] for value in committed_output)
    expected = {f"out:in-{number}" for number in range(inputs[0])}
    missing, duplicated = expected - set(by_input), {v: n for v, n in by_input.items() if n > 1}
    assert not missing, f"{where}: {len(missing)} of {inputs[0]} inputs lost, e.g. {sorted(missing)[:5]}"
    assert not duplicated, (
        f"{where}: {len(duplicated)} transformed twice, e.g. {list(duplicated.items())[:5]}"
    )
    aborted_reads = [value for value in committed_output if outcomes.get(value.rsplit(":", 1)[1]) == "abort"]
    assert aborted_reads == [], f"{where}: read aborted {aborted_reads[:5]}"
    everything = read_to_end(bootstrap, "output", PARTITIONS, "read_uncommitted")
    aborted_in_log = [
        record
        for records in everything.values()
        for record in records
        if outcomes.get(record.value.rsplit(":", 1)[1]) == "abort"
    ]
    assert aborted_in_log, "no aborted record in the output: the aborted-read check tested nothing"

    # Every replica of every partition byte-identical up to its high watermark.
    topics = {"input": PARTITIONS, "output": PARTITIONS, ORDERS: ORDER_PARTITIONS, **INTERNAL_TOPICS}
    marks = {topic: high_watermarks(cluster, topic, count) for topic, count in topics.items()}
    marks[ORDERS] = order_watermarks
    for topic, count in topics.items():
        wait_until(
            lambda topic=topic, count=count: all(
                len(partition.isr_nodes) == 3
                for partition in cluster.metadata(1, topic).topics[0].partitions[:count]
            ),
            timeout_s=120,
        )
    for broker in cluster.brokers.values():
        broker.terminate()
    for topic, watermarks in marks.items():
        for partition, high_watermark in watermarks.items():
            replicas = [
                batches_below(broker.data_dir / f"{topic}-{partition}", high_watermark)
                for broker in cluster.brokers.values()
            ]
            assert replicas[0] == replicas[1] == replicas[2], f"{where}: {topic}-{partition} diverged"
    print(f"{where}, {inputs[0]} inputs, {len(acknowledged)} acknowledged, {restarts[0]} worker restarts")
