"""Exactly-once in a cluster survives the broker that coordinates it.

A consume-transform-produce pipeline on 3 brokers (topics with 3 replicas, min.insync.replicas 2)
runs two transactional workers (confluent-kafka, send_offsets_to_transaction, read_committed) of
a group whose coordinator, and both transactional ids' coordinator, is one broker. That broker is
SIGKILLed mid-run and stays down: the partitions of the internal topics it led get new leaders,
which load them, and the pipeline goes on. Every input record appears exactly once in the
read_committed output, and the offsets committed before the kill are where the group resumes.
The internal topics have Kafka's 50 partitions here. Before, the coordinators' logs lived
unreplicated on the broker with the lowest id, and 0 of 20,000 records reached the output.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.cluster_mode.conftest import TRANSACTION_KEY, Cluster
from tests.cluster_mode.test_zookeeper_cluster import create_topic
from tests.conftest import wait_until
from tests.support import read_to_end, values

pytestmark = pytest.mark.zookeeper

INPUTS = 4_000
PARTITIONS = 4
GROUP = "transformers"
FEED_S = 8.0


class Pipeline:
    """Two workers (tests/transactions/processor.py), each started again when it exits, as a
    supervisor would: on any error a worker exits, and its successor's init_transactions fences
    the old session and aborts what it left open."""

    def __init__(self, cluster: Cluster, transactional_ids: list[str], logs: Path) -> None:
        self.bootstrap = cluster.bootstrap_servers
        self.logs = logs
        self.transactional_ids = transactional_ids
        self.restarts = 0
        self._stop = threading.Event()
        self._workers = [self._start(slot) for slot in range(len(transactional_ids))]
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor.start()

    def _start(self, slot: int) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "tests.transactions.processor", self.bootstrap, str(slot)]
        command += ["exactly-once", GROUP, self.transactional_ids[slot]]
        # Each worker's errors stay on file, to say why a run stalled.
        with (self.logs / f"worker-{slot}-{self.restarts}.log").open("w") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)

    def _supervise(self) -> None:
        while not self._stop.wait(0.2):
            for slot, worker in enumerate(self._workers):
                if worker.poll() is not None:
                    self.restarts += 1
                    self._workers[slot] = self._start(slot)

    def stop(self) -> None:
        """Kill the workers, then fence each transactional id as a successor's init_transactions
        would: a worker stuck in a call (see `onceflow.client_watchdog`) may leave a transaction
        open, which holds the output's last stable offset until its timeout. Its aborted records
        must then stay out of the read_committed output, and nothing else go missing."""
        self._stop.set()
        self._supervisor.join(timeout=10)
        for worker in self._workers:
            worker.kill()
            worker.wait(timeout=10)
        for transactional_id in self.transactional_ids:
            successor = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": transactional_id})
            successor.init_transactions(60)


def feed(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    started = time.monotonic()
    for number in range(INPUTS):
        producer.produce("input", key=str(number), value=f"in-{number}")
        if number % 100 == 0:
            producer.poll(0)
            time.sleep(max(0.0, started + number * FEED_S / INPUTS - time.monotonic()))
    assert producer.flush(60) == 0


def committed_offsets(bootstrap: str) -> list[int] | None:
    """The group's committed offset of each input partition (-1: none), as its coordinator
    answers; None when it does not answer now (a coordinator moving)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        partitions = consumer.committed([TopicPartition("input", p) for p in range(PARTITIONS)], timeout=5)
    except Exception:
        return None
    finally:
        consumer.close()
    return [partition.offset if partition.offset >= 0 else -1 for partition in partitions]


def answered(bootstrap: str) -> list[int]:
    """`committed_offsets`, from the first answer the coordinator gives (asking again could
    find it busy: a loaded run's second ask timed out)."""
    answers: list[list[int]] = []

    def answer() -> bool:
        offsets = committed_offsets(bootstrap)
        if offsets is not None:
            answers.append(offsets)
        return offsets is not None

    wait_until(answer, timeout_s=60)
    return answers[-1]


def committed_at_least(bootstrap: str, total: int) -> list[int] | None:
    offsets = committed_offsets(bootstrap)
    return offsets if offsets is not None and sum(max(o, 0) for o in offsets) >= total else None


def test_exactly_once_survives_the_sigkill_of_the_coordinators_broker(
    cluster: Cluster, tmp_path: Path
) -> None:
    for topic in ("input", "output"):
        create_topic(cluster, topic, PARTITIONS, 3, **{"min.insync.replicas": "2"})
    victim = cluster.wait_for_coordinator(GROUP)
    # Transactional ids that the same broker coordinates: the kill takes the group's and both
    # transactions' coordinators at once.
    cluster.wait_for_coordinator("transformer-0", TRANSACTION_KEY)  # __transaction_state exists
    candidates = (f"transformer-{n}" for n in range(500))
    transactional_ids = [tid for tid in candidates if cluster.coordinator(tid, TRANSACTION_KEY) == victim][:2]
    assert len(transactional_ids) == 2
    bootstrap = cluster.bootstrap_servers
    pipeline = Pipeline(cluster, transactional_ids, tmp_path)
    feeder = threading.Thread(target=feed, args=(bootstrap,))
    feeder.start()
    try:
        # Mid-run: a quarter of the input processed, and more arriving.
        wait_until(lambda: committed_at_least(bootstrap, INPUTS // 4) is not None, timeout_s=120)
        before = answered(bootstrap)
        assert sum(max(o, 0) for o in before) < INPUTS
        cluster.brokers[victim].kill()  # and it stays down
        killed_at = time.monotonic()
        assert cluster.wait_for_coordinator(GROUP, not_on=victim) != victim
        resumed = answered(bootstrap)
        assert all(after >= earlier for after, earlier in zip(resumed, before, strict=True)), (
            before,
            resumed,
        )
        wait_until(lambda: committed_at_least(bootstrap, sum(max(o, 0) for o in before) + 1), timeout_s=120)
        print(f"the pipeline moved again {time.monotonic() - killed_at:.1f} s after the kill")
        feeder.join(timeout=120)
        wait_until(lambda: committed_at_least(bootstrap, INPUTS), timeout_s=180)
    except TimeoutError as error:
        # Said here: an error of the `finally` below would hide it.
        print(f"{error!r}; workers started again {pipeline.restarts} times; their last lines:")
        for log in sorted(tmp_path.glob("worker-*.log"), key=lambda path: path.stat().st_mtime)[-4:]:
            print(log.name, *log.read_text().splitlines()[-20:], sep="\n  ")
        raise
    finally:
        pipeline.stop()
        feeder.join(timeout=10)

    output = Counter(values(read_to_end(cluster.bootstrap_servers, "output", PARTITIONS, "read_committed")))
    expected = {f"out:in-{number}" for number in range(INPUTS)}
    missing = expected - set(output)
    duplicated = {value: count for value, count in output.items() if count > 1}
    assert not missing, f"{len(missing)} of {INPUTS} lost, e.g. {sorted(missing)[:5]}"
    assert not duplicated, f"{len(duplicated)} duplicated, e.g. {list(duplicated.items())[:5]}"
    assert set(output) == expected
