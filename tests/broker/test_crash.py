"""SIGKILL the broker under load, damage its files, and check what survives."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from onceflow.log.batch import parse_batch_header
from tests.conftest import BrokerProcess
from tests.support import read_to_end
from tests.wire import WireClient, make_batch, produce

pytestmark = pytest.mark.soak

PARTITIONS = 2


def _create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)


def _read_all(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, list[str]]:
    return {
        partition: [read.value for read in reads]
        for partition, reads in read_to_end(bootstrap, topic, partitions).items()
    }


def test_acknowledged_writes_survive_repeated_sigkill(tmp_path: Path) -> None:
    # A long flush interval keeps the recovery point behind, so each restart really recovers.
    broker = BrokerProcess(tmp_path / "data", settings={"log.segment.bytes": "200000"}).start()
    try:
        _create_topic(broker.bootstrap_servers, "crash")
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 120_000,
                "reconnect.backoff.max.ms": 200,
            }
        )
        acked: list[str] = []
        failed: list[str] = []
        stop = threading.Event()

        def on_delivery(error: KafkaError | None, message: object) -> None:
            (failed if error is not None else acked).append(message.value().decode())  # type: ignore[attr-defined]

        def produce_forever() -> None:
            number = 0
            while not stop.is_set() and number < 200_000:
                try:
                    producer.produce(
                        "crash", key=str(number % 11), value=f"m-{number}", on_delivery=on_delivery
                    )
                    number += 1
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)
                if number % 200 == 0:
                    time.sleep(0.005)

        thread = threading.Thread(target=produce_forever)
        thread.start()
        for _ in range(5):
            time.sleep(1.5)
            broker.restart()
        time.sleep(1.0)
        stop.set()
        thread.join(timeout=30)
        assert producer.flush(120) == 0
        assert not failed, failed[:5]
        assert len(acked) > 500, "the producer made too little progress to prove anything"

        stored = _read_all(broker.bootstrap_servers, "crash")
        all_values = [value for values in stored.values() for value in values]
        assert len(all_values) == len(set(all_values)), "a value was stored twice"
        assert set(acked) <= set(all_values), "an acknowledged value was lost"
        for values in stored.values():
            per_key: dict[int, list[int]] = defaultdict(list)
            for value in values:
                number = int(value.split("-")[1])
                per_key[number % 11].append(number)
            assert all(numbers == sorted(numbers) for numbers in per_key.values()), "order broken"
    finally:
        broker.kill()


def test_retry_of_the_last_batch_before_a_crash_is_a_duplicate(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        _create_topic(broker.bootstrap_servers, "retry", 1)
        with WireClient(broker.bootstrap_servers) as wire:
            pid = _init_producer_id(wire)
            for sequence in range(0, 30, 3):
                batch = make_batch([f"r-{sequence + i}".encode() for i in range(3)], pid, 0, sequence)
                assert produce(wire, "retry", 0, batch).base_offset == sequence
        broker.restart()
        with WireClient(broker.bootstrap_servers) as wire:
            response = produce(wire, "retry", 0, batch)
            assert (response.error_code, response.base_offset) == (ErrorCode.none, 27)
            next_batch = make_batch([b"r-30"], pid, 0, 30)
            assert produce(wire, "retry", 0, next_batch).base_offset == 30
        assert _read_all(broker.bootstrap_servers, "retry", 1)[0] == [f"r-{n}" for n in range(31)]
    finally:
        broker.kill()


def _init_producer_id(wire: WireClient) -> int:
    return int(wire.init_producer_id().producer_id)


def _fill(broker: BrokerProcess, topic: str, batches: int) -> None:
    _create_topic(broker.bootstrap_servers, topic, 1)
    with WireClient(broker.bootstrap_servers) as wire:
        for number in range(batches):
            assert (
                produce(wire, topic, 0, make_batch([f"b-{number}".encode()] * 2)).error_code == ErrorCode.none
            )


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end"})
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()
    return int(high)


def test_torn_tail_is_truncated_on_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", settings={"log.flush.interval.ms": "600000"}).start()
    try:
        _fill(broker, "torn", 20)
        broker.kill()
        segment = sorted((tmp_path / "data" / "torn-0").glob("*.log"))[-1]
        size = segment.stat().st_size
        with open(segment, "r+b") as file:
            file.truncate(size - 7)  # the last batch loses its final bytes
        broker.start()
        assert _end_offset(broker.bootstrap_servers, "torn") == 38
        assert _read_all(broker.bootstrap_servers, "torn", 1)[0] == [
            f"b-{n}" for n in range(19) for _ in range(2)
        ]
        with WireClient(broker.bootstrap_servers) as wire:  # and the log takes new writes after the cut
            assert produce(wire, "torn", 0, make_batch([b"after"])).base_offset == 38
    finally:
        broker.kill()


@pytest.mark.parametrize("machine", ["survived", "rebooted"])
def test_a_flipped_byte_after_a_crash(tmp_path: Path, machine: str) -> None:
    # After a process crash every write reached the page cache: a bad batch between intact ones
    # is a byte gone bad, kept and answered CORRUPT_MESSAGE. After a reboot, writes past the
    # recovery point may be torn: Kafka's recovery cuts the log at the first bad batch.
    broker = BrokerProcess(tmp_path / "data", settings={"log.flush.interval.ms": "600000"}).start()
    try:
        _fill(broker, "flipped", 20)
        broker.kill()
        segment = sorted((tmp_path / "data" / "flipped-0").glob("*.log"))[-1]
        data = bytearray(segment.read_bytes())
        position = 0
        for _ in range(10):
            position += parse_batch_header(data, position).size
        eleventh = parse_batch_header(data, position)
        data[position + eleventh.size - 3] ^= 0x40  # a value byte of the eleventh batch
        segment.write_bytes(bytes(data))
        if machine == "rebooted":
            (tmp_path / "data" / ".lock").write_text("another boot\n")
        broker.start()
        kept = [f"b-{n}" for n in range(10) for _ in range(2)]
        if machine == "rebooted":
            assert _end_offset(broker.bootstrap_servers, "flipped") == 20
            assert _read_all(broker.bootstrap_servers, "flipped", 1)[0] == kept
        else:
            assert _end_offset(broker.bootstrap_servers, "flipped") == 40
            with WireClient(broker.bootstrap_servers) as wire:
                answers = [
                    wire.fetch({"flipped": [0]}, fetch_offset=offset).responses[0].partitions[0]
                    for offset in (20, 21, 22)
                ]
            assert [answer.error_code for answer in answers] == [ErrorCode.corrupt_message] * 2 + [0]
    finally:
        broker.kill()
