"""A full disk or a broker out of file descriptors while a transaction ends: read_committed readers
never see its aborted records, nothing acknowledged is lost, and the broker finishes the
transaction once the resource is back. Real faults: a small tmpfs filled to the last byte, and a
broker process whose descriptor limit is spent on idle connections."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from tests.conftest import FAST_JOINS, wait_until
from tests.wire import WireClient, make_batch, produce

TOPIC = "payments"
SETTINGS = {
    **FAST_JOINS,
    # The sweep that finishes a transaction whose phase two failed, every 200 ms.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
}


class _Broker:
    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        nofile: int | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.data_dir, self.log_path, self.nofile = data_dir, log_path, nofile
        self.settings = {**SETTINGS, **(settings or {})}
        self.process: subprocess.Popen[str] | None = None
        self.address = ""

    def start(self) -> _Broker:
        command = [sys.executable, "-m", "onceflow.cli", "broker", "--listen", "127.0.0.1:0"]
        command += ["--data-dir", str(self.data_dir)]
        for key, value in self.settings.items():
            command += ["--set", f"{key}={value}"]
        limit = self.nofile

        def limited() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=limited
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert "listening on" in line, self.log_path.read_text()
        self.address = line.rsplit(" ", 1)[1].strip()
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def logged(self, text: str) -> bool:
        return text in self.log_path.read_text()


class _Reader(threading.Thread):
    """A read_committed consumer that keeps every value it is given."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": address,
                "group.id": uuid.uuid4().hex,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
            }
        )
        self.consumer.assign([TopicPartition(TOPIC, 0, 0)])
        self.values: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.1)
            if message is not None and message.error() is None:
                self.values.append(message.value().decode())
        self.consumer.close()


def _transactional(address: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": address, "transactional.id": f"payer-{uuid.uuid4().hex}", "linger.ms": 1}
    )
    producer.init_transactions(30)
    return producer


def _write(producer: Producer, prefix: str) -> None:
    producer.begin_transaction()
    for number in range(10):
        producer.produce(TOPIC, value=f"{prefix}-{number}")
    assert producer.flush(30) == 0


def _end_in_background(producer: Producer, commit: bool) -> threading.Thread:
    """abort_transaction() or commit_transaction() as a client calls it: it may answer OK, retry
    for a while or time out; what a reader sees afterwards is the test."""

    def end() -> None:
        with suppress(KafkaException):
            (producer.commit_transaction if commit else producer.abort_transaction)(20)

    thread = threading.Thread(target=end, daemon=True)
    thread.start()
    return thread


@contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(disk: Path) -> Path:
    """Take every free byte of `disk`; returns the file that holds them."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError:
                    break
    finally:
        os.close(fd)
    return filler


def _after_the_fault(broker: _Broker, reader: _Reader, producer: Producer) -> None:
    """Once the resource is back: the abort completes, a committed transaction is read whole, and
    read_committed readers never got an aborted record, before a restart or after it."""
    _write(producer, "committed")
    _end_in_background(producer, commit=True).join(30)
    wait_until(lambda: "committed-9" in reader.values, 30)
    reader.stop.set()
    reader.join(10)
    assert [value for value in reader.values if not value.startswith("warm-up")] == [
        f"committed-{number}" for number in range(10)
    ]
    broker.kill()
    broker.start()
    after_restart = _Reader(broker.address)
    after_restart.start()
    wait_until(lambda: "committed-9" in after_restart.values, 30)
    after_restart.stop.set()
    after_restart.join(10)
    assert [value for value in after_restart.values if not value.startswith("warm-up")] == [
        f"committed-{number}" for number in range(10)
    ]


@pytest.mark.soak
def test_a_full_disk_while_a_transaction_aborts_shows_no_reader_its_records(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "disk", "30m") as disk, ExitStack() as stack:
        broker = _Broker(disk / "data", tmp_path / "broker.log").start()
        stack.callback(broker.kill)
        with WireClient(broker.address) as wire:
            wire.create_topic(TOPIC, 1)
        reader = _Reader(broker.address)
        reader.start()
        producer = _transactional(broker.address)
        _write(producer, "aborted")
        filler = _fill(disk)
        ending = _end_in_background(producer, commit=False)
        # The marker cannot go in with its index entry: the broker says so and retries.
        wait_until(lambda: broker.logged("No space left on device"), 30)
        wait_until(lambda: broker.logged("completing transaction"), 30)
        assert not [value for value in reader.values if value.startswith("aborted")]
        filler.unlink()
        ending.join(30)
        _after_the_fault(broker, reader, producer)


@pytest.mark.soak
def test_a_broker_out_of_file_descriptors_while_a_transaction_aborts_shows_no_reader_its_records(
    tmp_path: Path,
) -> None:
    # Descriptors run out the way they do for a broker with too many segments: every roll of a
    # topic with tiny segments takes three more, until one cannot be had.
    with ExitStack() as stack:
        broker = _Broker(tmp_path / "data", tmp_path / "broker.log", nofile=1024).start()
        stack.callback(broker.kill)
        admin = stack.enter_context(WireClient(broker.address))  # connected before they run out
        admin.create_topic(TOPIC, 1)
        assert _create_topic(admin, "many-segments", {"segment.bytes": "150"}) == 0
        reader = _Reader(broker.address)
        reader.start()
        producer = _transactional(broker.address)
        _write(producer, "warm-up")  # every API this test needs has been served once
        producer.commit_transaction(30)
        _write(producer, "aborted")
        filler = make_batch([b"x" * 40])
        while (code := produce(admin, "many-segments", 0, filler).error_code) == 0:
            pass
        assert code == ErrorCode.kafka_storage_error and broker.logged("Too many open files")
        ending = _end_in_background(producer, commit=False)
        ending.join(30)
        assert not [value for value in reader.values if value.startswith("aborted")]
        admin.request(20, 6, topics=[{"name": "many-segments", "topic_id": None}], timeout=10_000)
        ending.join(30)
        _after_the_fault(broker, reader, producer)


def _create_topic(wire: WireClient, name: str, configs: dict[str, str]) -> int:
    response = wire.request(
        19,
        7,
        topics=[
            {
                "name": name,
                "num_partitions": 1,
                "replication_factor": 1,
                "assignments": [],
                "configs": [{"name": key, "value": value} for key, value in configs.items()],
            }
        ],
        timeout=10_000,
    )
    return int(response.topics[0].error_code)


@pytest.mark.soak
def test_background_work_resumes_when_a_full_disk_has_room_again(tmp_path: Path) -> None:
    # The finding: one failed snapshot on a full disk ended the housekeeping task for good, and
    # retention with it (14 segments kept against a 300 kB limit) until a restart.
    with _tmpfs(tmp_path / "disk", "20m") as disk, ExitStack() as stack:
        every_200_ms = {
            "producer.snapshot.interval.ms": "200",
            "log.retention.check.interval.ms": "200",
            "log.flush.interval.ms": "200",
        }
        broker = _Broker(disk / "data", tmp_path / "broker.log", settings=every_200_ms).start()
        stack.callback(broker.kill)
        with WireClient(broker.address) as wire:
            configs = {"retention.bytes": "30000", "segment.bytes": "10240"}
            assert _create_topic(wire, TOPIC, configs) == 0
        failed: list[object] = []
        producer = Producer(
            {
                "bootstrap.servers": broker.address,
                "enable.idempotence": True,
                "batch.size": 8000,  # below segment.bytes
                "on_delivery": lambda error, _: error is None or failed.append(error),
            }
        )
        producer.produce(TOPIC, value=b"before the disk filled")
        assert producer.flush(30) == 0
        filler = _fill(disk)
        # A change to snapshot and checkpoint on the full disk (a record fits the segment's last
        # page, or the next one does), until the background work fails: the precondition.
        wait_until(lambda: _produced_until_background_failure(producer, broker), 30)
        filler.unlink()
        for number in range(100):
            producer.produce(TOPIC, value=b"%04d" % number + b"x" * 1000)
        assert producer.flush(30) == 0
        assert len(failed) < 30  # at most those sent on the full disk
        # 100 KB kept to retention.bytes, plus the oldest segment it still needs and the active one
        # (counting segments would depend on how the client batched, which the machine's load sets).
        wait_until(lambda: _segment_bytes(disk / "data" / f"{TOPIC}-0") <= 30_000 + 2 * 10_240, 30)
        checkpoint = disk / "data" / "recovery-point-offset-checkpoint"
        with WireClient(broker.address) as wire:
            end = wire.list_offset(TOPIC, 0)
        assert end >= 101
        wait_until(lambda: f"{TOPIC} 0 {end}" in checkpoint.read_text(), 30)
        assert broker.logged("works again")


def _produced_until_background_failure(producer: Producer, broker: _Broker) -> bool:
    if broker.logged("producer snapshots failed") or broker.logged("the recovery checkpoint failed"):
        return True
    producer.produce(TOPIC, value=b"while the disk is full")
    producer.poll(0.1)
    return False


def _segment_bytes(directory: Path) -> int:
    """The bytes of the partition's segment files (one deleted while counted counts nothing)."""
    total = 0
    for path in directory.glob("*.log"):
        with suppress(FileNotFoundError):
            total += path.stat().st_size
    return total
