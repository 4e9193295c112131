"""Spark forks its Python workers from `onceflow.spark_daemon` when the session names it: each
worker starts with what every onceflow task imports, and without Hypothesis."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_a_task_runs_in_a_worker_forked_from_the_preloading_daemon(spark: SparkSession) -> None:
    def report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Nested, so that Spark pickles it by value: no worker imports this test module.
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
        for _ in batches:
            yield pa.RecordBatch.from_pydict(
                {
                    "daemon": [parent[2].decode()],  # python -m MODULE
                    "preloaded": ["kio.schema.errors" in sys.modules],  # nothing in this task imports it
                    "hypothesis": [sys.modules.get("hypothesis", "absent") is None],
                }
            )

    [row] = (
        spark.range(1, numPartitions=1)
        .mapInArrow(report, "daemon string, preloaded boolean, hypothesis boolean")
        .collect()
    )
    assert row.daemon == "onceflow.spark_daemon"
    assert row.preloaded
    assert row.hypothesis, "a worker imports Hypothesis, which it never uses"


@pytest.mark.parametrize("also", ["", "pyarrow"])
def test_the_daemon_imports_nothing_that_starts_a_thread(also: str) -> None:
    """A forked worker keeps only the thread that forked it: a lock another thread of the daemon
    held would stay locked in it. pyarrow (the control) starts threads as it is imported."""
    script = (
        "import os, sys\n"
        "from onceflow.spark_daemon import preload\n"
        "preload()\n"
        f"if {also!r}: __import__({also!r})\n"
        "print(len(os.listdir('/proc/self/task')))\n"
    )
    threads = int(
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )
    assert (threads == 1) == (not also), threads
