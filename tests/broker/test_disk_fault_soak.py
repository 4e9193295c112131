"""A soak under resource faults: an idempotent producer, a transactional producer (committing and
aborting in turn) and a read_committed consumer run while the disk fills and frees and the
broker's descriptors run out and come back. The clients' own history is the oracle: nothing
acknowledged is lost, no aborted record is read, every transaction is read whole or not at all,
and the broker serves at the end.

`make test` runs it for ONCEFLOW_SOAK_SECONDS (15 s by default), `make soak` for 60 s."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import defaultdict
from contextlib import ExitStack, suppress
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from tests.broker.test_storage_faults import _Broker, _create_topic, _fill, _tmpfs
from tests.conftest import wait_until
from tests.support import read_to_end
from tests.wire import WireClient, make_batch, produce

pytestmark = pytest.mark.soak

SECONDS = float(os.environ.get("ONCEFLOW_SOAK_SECONDS", "15"))
PLAIN, TXN, SEGMENTS = "plain", "txn", "many-segments"


class _History:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acknowledged: set[str] = set()
        self.transactions: dict[str, list[str]] = {}  # id -> its values
        self.outcome: dict[str, str] = {}  # committed | aborted | unknown
        self.read_committed: list[str] = []


def _plain_producer(address: str, history: _History, stop: threading.Event) -> None:
    def delivered(error: KafkaError | None, message: object) -> None:
        if error is None:
            with history.lock:
                history.acknowledged.add(message.value().decode())  # type: ignore[attr-defined]

    producer = Producer(
        {
            "bootstrap.servers": address,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60_000,
            "on_delivery": delivered,
        }
    )
    number = 0
    while not stop.is_set():
        producer.produce(PLAIN, value=f"p-{number}")
        number += 1
        producer.poll(0.01)
    producer.flush(90)


def _transactions(address: str, history: _History, stop: threading.Event) -> None:
    producer = Producer(
        {"bootstrap.servers": address, "transactional.id": f"soak-{uuid.uuid4().hex}", "linger.ms": 5}
    )
    producer.init_transactions(60)
    number = 0
    while not stop.is_set():
        name, commit = f"t{number}", number % 2 == 0
        values = [f"{'c' if commit else 'a'}-{number}-{index}" for index in range(5)]
        history.transactions[name] = values
        history.outcome[name] = "unknown"
        try:
            producer.begin_transaction()
            for value in values:
                producer.produce(TXN, value=value)
            if commit:
                producer.commit_transaction(30)
                history.outcome[name] = "committed"
            else:
                producer.abort_transaction(30)
                history.outcome[name] = "aborted"
        except KafkaException as error:
            if error.args[0].txn_requires_abort():
                with suppress(KafkaException):
                    producer.abort_transaction(30)
                    history.outcome[name] = "aborted" if not commit else "unknown"
            elif error.args[0].fatal():
                return
        number += 1


def _reader(address: str, history: _History, stop: threading.Event) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": address,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TXN, 0, 0)])
    while not stop.is_set():
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            history.read_committed.append(message.value().decode())
    consumer.close()


def _faults(disk: Path, admin: WireClient, stop: threading.Event, counts: dict[str, int]) -> None:
    """The disk full for a while, then the descriptors gone for a while, in turn."""
    filler = make_batch([b"x" * 40])
    while not stop.is_set():
        full = _fill(disk)
        counts["disk full"] += 1
        stop.wait(1.0)
        full.unlink()
        stop.wait(1.0)
        assert _create_topic(admin, SEGMENTS, {"segment.bytes": "150"}) == 0
        while produce(admin, SEGMENTS, 0, filler).error_code == ErrorCode.none and not stop.is_set():
            pass
        counts["descriptors out"] += 1
        stop.wait(1.0)
        admin.request(20, 6, topics=[{"name": SEGMENTS, "topic_id": None}], timeout=10_000)
        wait_until(lambda: _create_topic(admin, "probe-" + uuid.uuid4().hex[:8], {}) == 0, 30)
        stop.wait(1.0)


def test_no_acknowledged_record_lost_and_no_aborted_record_read_while_disk_and_descriptors_fail(
    tmp_path: Path,
) -> None:
    history, stop, counts = _History(), threading.Event(), defaultdict(int)
    with _tmpfs(tmp_path / "disk", "40m") as disk, ExitStack() as stack:
        broker = _Broker(disk / "data", tmp_path / "broker.log", nofile=1024).start()
        stack.callback(broker.kill)
        admin = stack.enter_context(WireClient(broker.address, timeout_s=60))
        assert _create_topic(admin, PLAIN, {}) == 0 and _create_topic(admin, TXN, {}) == 0
        threads = [
            threading.Thread(target=work, args=(broker.address, history, stop), daemon=True)
            for work in (_plain_producer, _transactions, _reader)
        ]
        faults = threading.Thread(target=_faults, args=(disk, admin, stop, counts), daemon=True)
        for thread in threads:
            thread.start()
        # The first transaction creates __transaction_state (50 partitions, 150 descriptors):
        # before the faults, as a broker's internal topics exist long before its disk fills.
        wait_until(lambda: _values(history, "committed"), 60)
        faults.start()
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline and faults.is_alive():
            stop.wait(0.5)
        stop.set()
        faults.join(60)
        for thread in threads:
            thread.join(120)
        assert counts["disk full"] >= 1 and counts["descriptors out"] >= 1, counts  # the preconditions
        assert broker.process is not None and broker.process.poll() is None  # it never halted
        final = {
            partition: [read.value for read in reads]
            for partition, reads in read_to_end(broker.address, PLAIN, 1).items()
        }
        committed_read = [
            read.value for read in read_to_end(broker.address, TXN, 1, isolation="read_committed")[0]
        ]
    assert history.acknowledged and history.acknowledged <= set(final[0])  # nothing acknowledged lost
    aborted, committed = _values(history, "aborted"), _values(history, "committed")
    assert aborted and committed  # both happened
    assert not aborted & set(history.read_committed) and not aborted & set(committed_read)
    assert committed <= set(committed_read)
    for values in history.transactions.values():  # whole or not at all
        assert len(set(values) & set(committed_read)) in (0, len(values))


def _values(history: _History, outcome: str) -> set[str]:
    """The values of the transactions whose end the client saw as `outcome`."""
    return {
        value
        for name, values in history.transactions.items()
        if history.outcome[name] == outcome
        for value in values
    }
