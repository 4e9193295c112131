"""Fixtures for pipeline tests: a broker process, Spark on loopback, and a read_committed watcher."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from onceflow.pipeline.events import ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC, ensure_output_topics
from onceflow.pipeline.process import CommittedReader, PipelineProcess, payment_id
from onceflow.pipeline.settings import PipelineSettings
from tests.spark_cluster import SPARK_ENV


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Callable[[PipelineSettings], PipelineProcess]]:
    """Makes pipeline processes, logging to tmp_path/pipeline.log; kills what still runs at the end."""
    made: list[PipelineProcess] = []

    def make(settings: PipelineSettings) -> PipelineProcess:
        made.append(PipelineProcess(settings, log_path=tmp_path / "pipeline.log", env=SPARK_ENV))
        return made[-1]

    yield make
    for process in made:
        if process.running():
            process.kill()


def log_tail(tmp_path: Path) -> str:
    path = tmp_path / "pipeline.log"
    return path.read_text(errors="replace")[-6000:] if path.exists() else "(no log)"


ROUND_PAUSE_S = 0.05


class PairWatch(threading.Thread):
    """Reads order-status and seat-reservations with read_committed, each in turn up to its LSO.

    Reading one topic to its LSO at time t1 and then the other at t2 > t1, every transaction committed
    before t1 is visible on both, so every payment id seen on the first (up to t1) must be among those
    seen on the second (up to t2). A payment whose two rows became visible at different moments breaks
    this whenever a read falls between those moments, and for good if one row never comes.
    """

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        ensure_output_topics(bootstrap)
        self.reader = CommittedReader(bootstrap, [ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC])
        self.seen: dict[str, set[str]] = {ORDER_STATUS_TOPIC: set(), SEAT_RESERVATIONS_TOPIC: set()}
        self.checks = 0
        self.violations: list[str] = []
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            pairs = [
                (ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC),
                (SEAT_RESERVATIONS_TOPIC, ORDER_STATUS_TOPIC),
            ]
            while not self.stopping.is_set():
                for topic, other in pairs:
                    self.step(topic, other)
                # A round takes milliseconds once the reader is caught up: a pause keeps the
                # watcher from holding the broker's event loop while the pipeline writes.
                self.stopping.wait(ROUND_PAUSE_S)
        except BaseException as error:
            self.error = error
        finally:
            self.reader.close()

    def step(self, topic: str, other: str) -> None:
        values = self.reader.read_to_end(60, [topic])[topic]
        self.seen[topic].update(payment_id(value) for value in values)
        missing = self.seen[other] - self.seen[topic]
        if missing:
            self.violations.append(f"seen on {other} but not on {topic}: {sorted(missing)[:5]}")
        self.checks += 1

    def finish(self) -> None:
        """Stop after a last full round, so the final state is checked too."""
        self.stopping.set()
        self.join(120)
        assert not self.is_alive(), "the watcher hangs"
        if self.error is not None:
            raise self.error
