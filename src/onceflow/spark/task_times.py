"""Where the Spark tasks' time goes, stage by stage: a diagnostic, off unless asked for.

With ONCEFLOW_SPARK_TASK_TIMES naming a file, every read task, write task and slot keeper write
appends one JSON line to it when it ends: its kind, the streaming batch it served (if any), its
records and its seconds per stage (`benchmarks/spark_job.py` reads them). A clock costs two
`perf_counter()` calls per Arrow batch and stage, so it runs whether or not a file is named.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

ENVIRONMENT_VARIABLE = "ONCEFLOW_SPARK_TASK_TIMES"


class StageClock:
    """Seconds per stage of one task, summed over its batches."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.seconds: dict[str, float] = {}
        self.started = time.perf_counter()

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - began)

    def report(self, **fields: Any) -> None:
        """One line for the task, if a file is named; `fields` say which task it was."""
        path = os.environ.get(ENVIRONMENT_VARIABLE)
        if not path:
            return
        line = {
            "kind": self.kind,
            **fields,
            "total_s": time.perf_counter() - self.started,
            "stages_s": self.seconds,
        }
        # One write of a short line in append mode: lines of tasks in other processes do not mix.
        with open(path, "a") as times:
            times.write(json.dumps(line) + "\n")


def timed(items: Iterable[T], clock: StageClock, stage: str) -> Iterator[T]:
    """`items`, with the time spent waiting for each (and for their end) added to `stage`."""
    iterator = iter(items)
    while True:
        began = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            return
        finally:
            clock.add(stage, time.perf_counter() - began)
        yield item


def batch_id() -> int | None:
    """The streaming batch of the running Spark task, or None (a batch query, or no task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    return int(value) if value else None
