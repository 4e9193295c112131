"""A producer SIGKILLed mid-transaction pins the LSO until the coordinator's timeout aborts it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from onceflow import EmbeddedBroker
from tests.wire import WireClient

HANGING_PRODUCER = """
import sys, time
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": "hanging",
                     "transaction.timeout.ms": 3000})
producer.init_transactions(30)
producer.begin_transaction()
for number in range(20):
    producer.produce("pinned", value=f"hanging-{number}".encode(), partition=0)
producer.flush(30)
print("open", flush=True)
time.sleep(600)
"""


def test_a_dead_producers_transaction_stalls_read_committed_until_its_timeout(tmp_path: Path) -> None:
    config = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"}
    with EmbeddedBroker(tmp_path, config=config) as broker:
        with WireClient(broker.bootstrap_servers) as wire:
            wire.create_topic("pinned", 1)
        dead = subprocess.Popen(
            [sys.executable, "-c", HANGING_PRODUCER, broker.bootstrap_servers],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert dead.stdout is not None and dead.stdout.readline().strip() == "open"
        finally:
            dead.send_signal(signal.SIGKILL)
            dead.wait(timeout=10)
        killed_at = time.monotonic()

        later = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "alive"})
        later.init_transactions(30)
        later.begin_transaction()
        for number in range(10):
            later.produce("pinned", value=f"later-{number}".encode(), partition=0)
        later.commit_transaction(30)

        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "group.id": "stalled",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition("pinned", 0, 0)])
        seen: list[str] = []
        stalled_until = None
        deadline = time.monotonic() + 30
        while len(seen) < 10 and time.monotonic() < deadline:
            for message in consumer.consume(100, timeout=0.1):
                if message.error() is None:
                    if stalled_until is None:
                        stalled_until = time.monotonic()
                    seen.append(message.value().decode())
        consumer.close()
    assert seen == [f"later-{number}" for number in range(10)], "aborted or missing records"
    assert stalled_until is not None
    # Committed records behind the open transaction waited for its 3 s timeout (which started
    # when the dead producer added its partition, a moment before the kill).
    assert stalled_until - killed_at >= 1.5
