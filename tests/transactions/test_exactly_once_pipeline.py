"""Consume-transform-produce under SIGKILL: two workers share a group and commit their offsets
inside their transactions; killed and restarted at random for 30 s while input keeps
arriving, the output read with read_committed holds every input record exactly once."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess
from tests.support import read_to_end, values

pytestmark = pytest.mark.soak

INPUTS = 20_000
PARTITIONS = 4
CHAOS_SECONDS = 30


def _start_worker(bootstrap: str, slot: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.transactions.processor", bootstrap, str(slot), mode],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _feed_inputs(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    per_second = INPUTS / (CHAOS_SECONDS - 5)
    started = time.monotonic()
    for number in range(INPUTS):
        producer.produce("input", key=str(number), value=f"in-{number}")
        if number % 100 == 0:
            producer.poll(0)
            time.sleep(max(0.0, started + number / per_second - time.monotonic()))
    assert producer.flush(60) == 0


def _committed_output(bootstrap: str) -> Counter[str]:
    return Counter(values(read_to_end(bootstrap, "output", PARTITIONS, "read_committed")))


def _group_lag(bootstrap: str) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "transformers", "enable.auto.commit": False}
    )
    committed = consumer.committed([TopicPartition("input", p) for p in range(PARTITIONS)], timeout=10)
    consumer.close()
    return INPUTS - sum(max(tp.offset, 0) for tp in committed)


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once"])
def test_two_workers_killed_at_random(tmp_path: Path, mode: str) -> None:
    """exactly-once must transform every record once; at-least-once, under the same kills, must
    duplicate some, which shows that the check can fail."""
    broker = BrokerProcess(tmp_path / "data").start()
    workers: dict[int, subprocess.Popen[str]] = {}
    rng = random.Random(20261122)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for topic in ("input", "output"):
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=30)
        # Input keeps arriving during the whole chaos period, so kills land mid-transaction.
        feeder = threading.Thread(target=_feed_inputs, args=(broker.bootstrap_servers,))
        feeder.start()
        workers = {slot: _start_worker(broker.bootstrap_servers, slot, mode) for slot in range(2)}
        kills = 0
        chaos_ends = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < chaos_ends:
            time.sleep(rng.uniform(0.5, 3.0))
            slot = rng.randrange(2)
            workers[slot].send_signal(signal.SIGKILL)
            workers[slot].wait(timeout=10)
            kills += 1
            time.sleep(rng.uniform(0.0, 1.0))
            workers[slot] = _start_worker(broker.bootstrap_servers, slot, mode)
        feeder.join(timeout=60)
        deadline = time.monotonic() + 120
        while _group_lag(broker.bootstrap_servers) > 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert _group_lag(broker.bootstrap_servers) == 0, "the workers never caught up"

        output = _committed_output(broker.bootstrap_servers)
        expected = {f"out:in-{number}" for number in range(INPUTS)}
        missing = expected - set(output)
        duplicated = {value: count for value, count in output.items() if count > 1}
        assert kills >= 8
        assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
        if mode == "exactly-once":
            assert not duplicated, f"{len(duplicated)} duplicated, e.g. {list(duplicated.items())[:5]}"
        else:
            assert duplicated, "at-least-once showed no duplicate: the kills are too mild to prove anything"
    finally:
        for worker in workers.values():
            worker.kill()
            worker.wait(timeout=10)
        broker.kill()
