"""Compacted topics through real clients: the background cleaner keeps the last value per key at
its offset, drops old tombstones and aborted transactions, and survives a SIGKILL mid-clean."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from onceflow import EmbeddedBroker
from tests.conftest import FAST_JOINS, BrokerProcess

TOPIC = "compacted"
CLEANER = {**FAST_JOINS, "log.cleaner.backoff.ms": "50"}
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": "2048",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "60000",
}
Row = tuple[int, str, str | None]  # offset, key, value


def _create(bootstrap: str, config: dict[str, str] = TOPIC_CONFIG) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(timeout=30)


def _produce(producer: Producer, key: str, value: str | None, offsets: dict[str, int], **kwargs: int) -> None:
    def delivered(error: KafkaError | None, message: Message) -> None:
        offsets[key] = -1 if error else message.offset()  # -1 matches no offset: the test fails

    producer.produce(TOPIC, key=key, value=value, on_delivery=delivered, **kwargs)


def _roll_past(bootstrap: str) -> None:
    """Enough records of one other key that everything before lands in closed segments."""
    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 5})
    for _ in range(30):
        producer.produce(TOPIC, key="filler", value="f" * 100)
    assert producer.flush(30) == 0


def _read_confluent(bootstrap: str, isolation: str = "read_uncommitted") -> list[Row]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        end = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)[1]
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        rows: list[Row] = []
        deadline = time.monotonic() + 30
        position = 0
        while position < end and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error():
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(message.error())
                value = message.value()
                rows.append((message.offset(), message.key().decode(), value and value.decode()))
            position = consumer.position([TopicPartition(TOPIC, 0)])[0].offset
        return [row for row in rows if row[1] != "filler"]
    finally:
        consumer.close()


def _read_kafka_python(bootstrap: str) -> list[Row]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partition = KafkaTopicPartition(TOPIC, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        end = consumer.end_offsets([partition])[partition]
        rows: list[Row] = []
        deadline = time.monotonic() + 30
        while consumer.position(partition) < end and time.monotonic() < deadline:
            for message in consumer.poll(timeout_ms=500).get(partition, []):
                value = message.value
                rows.append((message.offset, message.key.decode(), value and value.decode()))
        return [row for row in rows if row[1] != "filler"]
    finally:
        consumer.close()


def _eventually(read: Callable[[], list[Row]], expected: list[Row], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    rows = read()
    while rows != expected and time.monotonic() < deadline:
        rows = read()
    assert rows == expected


def test_keyed_writes_overwrites_and_tombstones_read_back_compacted(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "data", config=CLEANER) as broker:
        _create(broker.bootstrap_servers)
        # Compressed batches of many records: the cleaner keeps some records of a batch.
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "linger.ms": 20,
                "batch.num.messages": 5,
                "compression.type": "gzip",
            }
        )
        offsets: dict[str, int] = {}
        for round_ in range(6):
            for key in ("a", "b", "c", "d"):
                _produce(producer, key, f"{key}{round_}", offsets)
        hour_ago = int(time.time() * 1000) - 3_600_000
        _produce(producer, "c", None, offsets, timestamp=hour_ago)  # past delete.retention.ms
        _produce(producer, "d", None, offsets)  # a fresh tombstone stays
        assert producer.flush(30) == 0
        _roll_past(broker.bootstrap_servers)
        expected = sorted([(offsets["a"], "a", "a5"), (offsets["b"], "b", "b5"), (offsets["d"], "d", None)])
        _eventually(lambda: _read_confluent(broker.bootstrap_servers), expected)
        assert _read_kafka_python(broker.bootstrap_servers) == expected


def test_a_compacted_topic_refuses_records_without_a_key(broker: EmbeddedBroker) -> None:
    _create(broker.bootstrap_servers)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "retries": 0})
    errors: list[KafkaError] = []
    producer.produce(TOPIC, value="no key", on_delivery=lambda error, _: errors.append(error))
    assert producer.flush(30) == 0
    producer.produce(TOPIC, key="k", value="keyed", on_delivery=lambda error, _: errors.append(error))
    assert producer.flush(30) == 0
    assert [error and error.code() for error in errors] == [KafkaError.INVALID_RECORD, None]


def test_transactions_in_a_compacted_topic_read_committed_after_cleaning(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "data", config=CLEANER) as broker:
        _create(broker.bootstrap_servers)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "compactor"})
        producer.init_transactions(30)
        offsets: dict[str, int] = {}
        for commit, value in ((True, "committed"), (False, "aborted")):
            producer.begin_transaction()
            for key in ("a", "b"):
                _produce(producer, key, value, offsets)
            producer.flush(30)
            if commit:
                committed = dict(offsets)
                producer.commit_transaction(30)
            else:
                producer.abort_transaction(30)
        producer.begin_transaction()
        _produce(producer, "c", "later", offsets)
        producer.commit_transaction(30)
        _roll_past(broker.bootstrap_servers)
        expected = [(committed["a"], "a", "committed"), (committed["b"], "b", "committed")]
        expected.append((offsets["c"], "c", "later"))
        # Once cleaned, even read_uncommitted sees no aborted record.
        _eventually(lambda: _read_confluent(broker.bootstrap_servers), expected)
        assert _read_confluent(broker.bootstrap_servers, "read_committed") == expected


@pytest.mark.parametrize("failpoint", ["cleaner.before-swap", "cleaner.mid-swap"])
def test_a_sigkill_in_the_middle_of_a_clean_loses_nothing(tmp_path: Path, failpoint: str) -> None:
    # Written with the cleaner off, so that its kill cannot interrupt the writes.
    process = BrokerProcess(tmp_path / "data", settings={**CLEANER, "log.cleaner.enable": "false"})
    process.start()
    try:
        _create(process.bootstrap_servers)
        producer = Producer(
            {"bootstrap.servers": process.bootstrap_servers, "linger.ms": 20, "batch.num.messages": 5}
        )
        offsets: dict[str, int] = {}
        for round_ in range(6):
            for key in ("a", "b", "c"):
                _produce(producer, key, f"{key}{round_}", offsets)
        assert producer.flush(30) == 0
        _roll_past(process.bootstrap_servers)
        process.terminate()
        process.settings, process.env = CLEANER, {"ONCEFLOW_FAILPOINTS": failpoint}
        process.start()
        assert process.process is not None
        assert process.process.wait(timeout=30) == -9  # killed at the failpoint by the cleaner
        directory = tmp_path / "data" / f"{TOPIC}-0"
        assert {".cleaned", ".swap"} & {path.suffix for path in directory.iterdir()}
        # Restarted with the cleaner off: a new clean would write `.cleaned` files of its own.
        process.settings, process.env = {**CLEANER, "log.cleaner.enable": "false"}, {}
        process.start()
        # Start-up finished the swap (.swap) or threw the unfinished clean away (.cleaned).
        assert not {".cleaned", ".swap"} & {path.suffix for path in directory.iterdir()}
        expected = sorted((offsets[key], key, f"{key}5") for key in ("a", "b", "c"))
        rows = _read_confluent(process.bootstrap_servers)
        latest = {key: (offset, value) for offset, key, value in rows}
        assert sorted((offset, key, value) for key, (offset, value) in latest.items()) == expected
        # And with the cleaner on again, the log ends up compacted.
        process.terminate()
        process.settings = CLEANER
        process.start()
        _eventually(lambda: _read_confluent(process.bootstrap_servers), expected)
    finally:
        process.kill()
