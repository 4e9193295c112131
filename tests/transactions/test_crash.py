"""SIGKILL the broker at each step of the two-phase commit; the restart finishes the
transaction in the decided direction and a partial transaction is never visible."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess
from tests.support import read_to_end, values

pytestmark = pytest.mark.soak

PARTITIONS = 3
TOPIC = "two-phase"


def _read_committed(bootstrap: str) -> list[str]:
    return values(read_to_end(bootstrap, TOPIC, PARTITIONS, "read_committed", timeout_s=30))


class Watcher(threading.Thread):
    """A read_committed consumer that records everything it ever sees, during the crash too."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.seen: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "watcher",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "reconnect.backoff.max.ms": 100,
            }
        )
        consumer.assign([TopicPartition(TOPIC, partition, 0) for partition in range(PARTITIONS)])
        while not self.stop.is_set():
            for message in consumer.consume(100, timeout=0.1):
                if message.error() is None:
                    self.seen.append(message.value().decode())
        consumer.close()


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
@pytest.mark.parametrize("failpoint", ["txn.after-prepare", "txn.between-markers", "txn.before-complete"])
def test_a_crash_during_two_phase_commit(tmp_path: Path, failpoint: str, commit: bool) -> None:
    settings = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
    broker = BrokerProcess(
        tmp_path / "data", settings=settings, env={"ONCEFLOW_FAILPOINTS": failpoint}
    ).start()
    watcher = Watcher(broker.bootstrap_servers)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=30)
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "transactional.id": "crashing",
                "reconnect.backoff.max.ms": 100,
                "transaction.timeout.ms": 60_000,
            }
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        values = [f"v-{number}" for number in range(30)]
        for number, value in enumerate(values):
            producer.produce(TOPIC, value=value, partition=number % PARTITIONS)
        producer.flush(30)
        watcher.start()

        outcome: list[BaseException | None] = []

        def end() -> None:
            try:
                (producer.commit_transaction if commit else producer.abort_transaction)(60)
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        ender = threading.Thread(target=end)
        ender.start()
        assert broker.process is not None
        broker.process.wait(timeout=30)  # the failpoint kills it
        broker.env = {}
        broker.start()  # the restart completes the prepared transaction
        ender.join(timeout=90)
        assert outcome == [None], outcome

        expected = sorted(values) if commit else []
        assert sorted(_read_committed(broker.bootstrap_servers)) == expected
        time.sleep(0.5)
        watcher.stop.set()
        watcher.join(timeout=10)
        assert set(watcher.seen) <= set(expected), "the watcher saw data of an aborted transaction"
        assert len(watcher.seen) == len(set(watcher.seen)), "the watcher saw a record twice"

        producer.begin_transaction()  # and the producer carries on
        producer.produce(TOPIC, value=b"after", partition=0)
        producer.commit_transaction(30)
        assert sorted(_read_committed(broker.bootstrap_servers)) == sorted([*expected, "after"])
    finally:
        watcher.stop.set()
        broker.kill()
