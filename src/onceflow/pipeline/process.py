"""The pipeline as a process that can be killed like a crashed machine, and what it leaves behind.

workload = generate(bootstrap, count=1000, seed=7)
pipeline = PipelineProcess(PipelineSettings(bootstrap, Path("ckpt"), "balances.db", until_idle_s=5))
pipeline.start()
...                       # wait for some progress: read_progress("balances.db")
pipeline.kill()           # SIGKILL to the driver, its JVM and the Python workers at once
pipeline.start()          # same checkpoint: Spark replays the unfinished batches
pipeline.wait(300)
assert read_balances("balances.db") == workload.expected_balances()
outputs = read_outputs(bootstrap)   # read_committed, every partition up to its LSO
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from onceflow.pipeline.events import ORDER_STATUS_TOPIC, REJECTED_TOPIC, SEAT_RESERVATIONS_TOPIC
from onceflow.pipeline.settings import BALANCES_QUERY_ID, PipelineSettings
from onceflow.sessions import kill_session
from onceflow.stores import Progress, open_store


def command_line(settings: PipelineSettings) -> list[str]:
    command = [sys.executable, "-m", "onceflow.cli", "pipeline", "run", "--bootstrap", settings.bootstrap]
    command += ["--master", settings.master, "--checkpoint", str(settings.checkpoint), "--db", settings.db]
    command += ["--guarantee", settings.guarantee]
    if settings.trigger_ms is not None:
        command += ["--trigger-ms", str(settings.trigger_ms)]
    if settings.max_offsets is not None:
        command += ["--max-offsets", str(settings.max_offsets)]
    if settings.until_idle_s is not None:
        command += ["--until-idle", str(settings.until_idle_s)]
    return command


@dataclass
class PipelineProcess:
    """`onceflow pipeline run` in a session of its own, so that one SIGKILL reaches all of it."""

    settings: PipelineSettings
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> PipelineProcess:
        if self.log_path is not None:
            self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command_line(self.settings),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        return self

    def kill(self) -> None:
        """SIGKILL every process of the pipeline's session: no shutdown code runs anywhere."""
        assert self.process is not None
        kill_session(self.process.pid)
        self.process.wait()
        self._close_log()

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        finally:
            if self.process.returncode is not None:
                self._close_log()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def read_balances(db: str) -> dict[str, int]:
    """Per-account balances in cents, without accounts at 0 (a workload never expects those)."""
    with open_store(db) as store:
        return {account: balance for account, balance in store.balances().items() if balance}


def read_progress(db: str) -> Progress | None:
    with open_store(db) as store:
        return store.progress(BALANCES_QUERY_ID)


@dataclass
class Outputs:
    """Payment ids per output topic as a read_committed reader sees them, with repeats counted."""

    order_status: Counter[str]
    seat_reservations: Counter[str]
    rejected: int


def read_outputs(bootstrap: str, timeout_s: float = 60.0) -> Outputs:
    reader = CommittedReader(bootstrap, [ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC, REJECTED_TOPIC])
    try:
        records = reader.read_to_end(timeout_s)
    finally:
        reader.close()
    return Outputs(
        Counter(payment_id(value) for value in records[ORDER_STATUS_TOPIC]),
        Counter(payment_id(value) for value in records[SEAT_RESERVATIONS_TOPIC]),
        len(records[REJECTED_TOPIC]),
    )


def payment_id(value: bytes) -> str:
    """The payment id of an order-status or seat-reservation value, without a JSON parse."""
    marker = b'"payment_id":"'
    start = value.index(marker) + len(marker)
    return value[start : value.index(b'"', start)].decode()


class CommittedReader:
    """A read_committed consumer of whole topics that reads, on demand, up to each partition's LSO."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": "onceflow-pipeline-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
        self.consumer = Consumer({**config, "enable.partition.eof": True})
        # The LSOs are asked by a consumer that fetches nothing: the reading one's ListOffsets
        # would wait behind its own long-polling Fetch on the same connection (a broker answers a
        # connection's requests in order), up to fetch.wait.max.ms (500 ms) per partition.
        self.lsos = Consumer(config)
        self.topics = topics
        metadata = self.consumer.list_topics(timeout=30)
        self.partitions = [
            TopicPartition(topic, partition, 0)
            for topic in topics
            for partition in sorted(metadata.topics[topic].partitions)
        ]
        self.consumer.assign(self.partitions)
        self.positions = {(tp.topic, tp.partition): 0 for tp in self.partitions}

    def read_to_end(self, timeout_s: float, topics: list[str] | None = None) -> dict[str, list[bytes]]:
        """Values of `topics` (default all) from where the last read stopped up to the LSOs of now."""
        wanted = [tp for tp in self.partitions if topics is None or tp.topic in topics]
        others = [tp for tp in self.partitions if tp not in wanted]
        targets = {}
        for tp in wanted:
            _, lso = self.lsos.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            targets[(tp.topic, tp.partition)] = lso
        values: dict[str, list[bytes]] = {topic: [] for topic in self.topics}
        deadline = time.monotonic() + timeout_s
        if others:
            self.consumer.pause(others)
        try:
            while any(self.positions[key] < target for key, target in targets.items()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"read_committed reader stuck below the LSOs {targets}")
                for message in self.consumer.consume(1000, timeout=0.2):
                    topic, partition, offset = message.topic(), message.partition(), message.offset()
                    assert topic is not None and partition is not None and offset is not None
                    error = message.error()
                    if error is None:
                        values[topic].append(message.value() or b"")
                        self.positions[(topic, partition)] = offset + 1
                    elif error.code() == KafkaError._PARTITION_EOF:
                        # Markers and aborted records leave gaps no record reports; the end does.
                        self.positions[(topic, partition)] = max(self.positions[(topic, partition)], offset)
                    else:
                        raise KafkaException(error)
        finally:
            if others:
                self.consumer.resume(others)
        return values

    def close(self) -> None:
        self.consumer.close()
        self.lsos.close()
