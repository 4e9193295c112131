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

from onceflow.spark_daemon import SINGLE_THREADED

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


@pytest.mark.parametrize("preload", [True, False])
def test_the_daemon_preloads_without_starting_a_thread(preload: bool) -> None:
    """A forked worker keeps only the thread that forked it: a lock another thread of the daemon
    held would stay locked in it. numpy (OpenBLAS) and pyarrow (jemalloc) start a thread as they
    are imported unless told not to: the control imports the same modules without `preload`."""
    imports = "spark_daemon.preload()" if preload else "for name in spark_daemon.PRELOADED: __import__(name)"
    script = (
        f"import os\nfrom onceflow import spark_daemon\n{imports}\n"
        "print(len(os.listdir('/proc/self/task')))\n"
    )
    environment = {key: value for key, value in os.environ.items() if key not in SINGLE_THREADED}
    threads = int(
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env=environment,
        ).stdout
    )
    assert (threads == 1) == preload, threads
