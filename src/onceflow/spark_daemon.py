"""PySpark's worker daemon, with what every onceflow task imports imported once, before it forks.

Spark forks each task's Python worker (its reader, transform or writer) from one daemon per
executor, and a forked worker starts with the modules its daemon had imported. PySpark's daemon
imports almost nothing, so every new worker imported PySpark's worker, confluent-kafka and the
Kafka protocol (kio) itself: 0.5-1.0 s of CPU each, in a query that forks dozens of them (a worker
is not reused after a failed task, nor across executors or restarts). With this module as
`spark.python.daemon.module` (`onceflow.spark.DAEMON_MODULE`), the daemon imports them once. (The
driver's planning calls fork from PySpark's own daemon whatever the setting says.)

The daemon must stay single-threaded: a forked child keeps only the thread that forked, and a
lock another thread held stays locked in it forever (why PySpark imports its worker after the
fork). numpy (OpenBLAS) and pyarrow (its jemalloc) start a thread as they are imported unless
told not to (`SINGLE_THREADED`, which the workers inherit); so told, they, pandas and
`onceflow.spark` are preloaded too: the Spark tests' Python workers took 47 s of CPU instead of
79 (0.6 s a worker).
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

PRELOADED = (
    "pyspark.worker",
    "pyspark.sql.datasource",
    "pyspark.sql.streaming.datasource",
    "confluent_kafka",
    "confluent_kafka.admin",
    "kio.schema.errors",
    "onceflow.protocol.build",
    "onceflow.protocol.codec",
    "onceflow.records",
    "numpy",
    "pyarrow",
    "pandas",
    "onceflow.spark",
)
# Without them, numpy (OpenBLAS) and pyarrow (its jemalloc) start a thread as they are imported.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


def preload() -> None:
    """Imports `PRELOADED`, then freezes what they made (`gc.freeze`): no collection in a
    forked worker walks them, which would write to, and so copy, every page they are on."""
    os.environ.update(SINGLE_THREADED)
    for name in PRELOADED:
        importlib.import_module(name)
    gc.freeze()


if __name__ == "__main__":
    # No worker uses Hypothesis, but kio registers strategies for its types whenever Hypothesis
    # is importable (a development install): 0.2 s of each worker's start (as `onceflow.cli`).
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]  # None blocks an import
    preload()
    from pyspark import daemon

    daemon.manager()
