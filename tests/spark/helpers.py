"""A Spark job in its own process group, so a test can SIGKILL the driver, its JVM and workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from onceflow.sessions import kill_session
from tests.spark_cluster import SPARK_ENV

JOB = Path(__file__).with_name("stream_job.py")


class StreamJob:
    def __init__(self, *args: str, log: Path) -> None:
        self.args = args
        self.log = log
        self.process: subprocess.Popen[str] | None = None
        self.progress: list[dict[str, Any]] = []

    def start(self, env: dict[str, str] | None = None) -> StreamJob:
        self.progress = []
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(JOB), *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
                env={**os.environ, **SPARK_ENV, "PYSPARK_PYTHON": sys.executable, **(env or {})},
            )
        threading.Thread(target=self._read_progress, daemon=True).start()
        return self

    def _read_progress(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.progress.append(json.loads(line))

    def wait_for(self, done: Any, timeout_s: float, what: str) -> None:
        """Wait until `done(progress)` holds, failing early if the job died."""
        deadline = time.monotonic() + timeout_s
        assert self.process is not None
        while not done(self.progress):
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the job exited ({self.process.returncode}) before {what}; see {self.log}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; see {self.log}")
            time.sleep(0.2)

    def wait_exit(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL the whole session: the Python driver, the JVM and the Python workers."""
        assert self.process is not None
        kill_session(self.process.pid)
        self.process.wait(timeout=30)


def reached(end: dict[str, dict[str, int]]) -> Any:
    """A `wait_for` condition: some micro-batch ended at `end` (every partition's LSO)."""
    return lambda progress: any(report["end"] == end for report in progress)


def produce_transactions(
    bootstrap: str,
    topic: str,
    values: list[str],
    per_transaction: int,
    abort_every: int,
    transactional_id: str,
) -> list[str]:
    """Write `values` in transactions, aborting every `abort_every`-th; return the committed ones.

    Each aborted transaction is flushed first, so its records and markers really reach the log.
    """
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5}
    )
    producer.init_transactions(30)
    committed: list[str] = []
    for number, first in enumerate(range(0, len(values), per_transaction)):
        chunk = values[first : first + per_transaction]
        producer.begin_transaction()
        for index, value in enumerate(chunk):
            producer.produce(topic, value=value.encode(), key=str(index).encode())
        producer.flush(30)
        if abort_every and number % abort_every == abort_every - 1:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed += chunk
    return committed
