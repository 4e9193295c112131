"""Spark side of the `spark` benchmark: one local[2] session, figures as one JSON line on stdout.

    spark_job.py --bootstrap HOST:PORT --topic T --partitions 4 --records N
                 --max-offsets-per-trigger M --rounds R --reads K --work-dir DIR

Runs the same streaming query (onceflow source -> a light transform -> onceflow sink) to the
input's end offsets, exactly-once and at-least-once in the order EO ALO ALO EO ..., R times each,
then READ_WARM_UPS untimed and K timed batch reads of the whole topic. The session starts once,
before any clock, in this process of its own, and runs both queries for a few batches before any
clock too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

GUARANTEES = ("exactly-once", "at-least-once")
# Where a micro-batch's time goes, from its progress's durationMs timers (the rest is "other").
STAGES = {
    "offsets": ("latestOffset", "getOffset", "getEndOffset"),  # the source's planning requests
    "planning": ("getBatch", "queryPlanning"),
    "offset log": ("walCommit",),  # the batch's offsets into the checkpoint
    "tasks": ("addBatch",),  # the job that reads, transforms and writes: tasks, workers, clients
    "commit": ("commitOffsets",),  # the sink's commit and the checkpoint's commit log
}
_METADATA_TIMEOUT_S = 30.0
_QUERY_TIMEOUT_S = 900.0
# The session's first query ran its batches about a third slower than the later ones (the JVM's
# JIT and the first Python workers): warm both guarantees' paths up, so run order does not decide.
WARM_UP_BATCHES = 8
# A batch read's job is of another shape than the queries', and the JVM's JIT kept compiling for it
# (Spark's planner and the scan) over the first reads: in a fresh session of batch reads alone, the
# 2nd to 5th read ran 0.5-0.9 M records/s, later ones 0.7-1.0 M, and the JIT's threads took 0.6-0.85
# CPU s in the first reads against about 0.2 after ten. Timed reads start after these.
READ_WARM_UPS = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--max-offsets-per-trigger", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--reads", type=int, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    args = parser.parse_args()
    # Executors run this interpreter, which has onceflow; loopback only, whatever the host name.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Imported after the environment is set: the JVM starts with the session.
    from pyspark.sql import SparkSession

    import onceflow.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Every batch's progress is needed, not only the last 100.
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
        # Spark's default, said out loud: the data source's clients live in its Python workers.
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    onceflow.spark.register(spark)
    try:
        ends = end_offsets(args.bootstrap, args.topic, args.partitions)
        if sum(ends.values()) != args.records:
            raise SystemExit(
                f"topic {args.topic} holds {sum(ends.values())} records, expected {args.records}"
            )
        for guarantee in GUARANTEES:
            warm_up(spark, args, guarantee)
        streams: dict[str, list[dict[str, Any]]] = {guarantee: [] for guarantee in GUARANTEES}
        # Later queries in a session run faster (the JVM warms up), so the order flips every
        # round, EO ALO ALO EO: with an even number of rounds that trend hits both alike.
        for round_number in range(1, args.rounds + 1):
            for guarantee in GUARANTEES if round_number % 2 else reversed(GUARANTEES):
                streams[guarantee].append(stream(spark, args, guarantee, round_number, ends))
        warm_ups = [batch_read(spark, args) for _ in range(READ_WARM_UPS)]
        reads = [batch_read(spark, args) for _ in range(args.reads)]
    finally:
        spark.stop()
    print(json.dumps({"stream": streams, "read": reads, "read_warm_up": warm_ups}))
    return 0


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-bench-offsets"})
    try:
        return {
            str(partition): consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=_METADATA_TIMEOUT_S
            )[1]
            for partition in range(partitions)
        }
    finally:
        consumer.close()


def read_tasks(spark: Any) -> str:
    """A read task per core, as the README advises: Spark's cost per task of a Python data source
    is tens of ms, so four partitions on two cores read faster in one round of two tasks."""
    return str(spark.sparkContext.defaultParallelism)


def start_query(spark: Any, args: argparse.Namespace, guarantee: str, name: str) -> Any:
    """The benchmark's query, onceflow source -> transform -> onceflow sink, from the earliest offsets."""
    from pyspark.sql import functions

    payments = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
        .option("maxPartitions", read_tasks(spark))
        .load()
    )
    transformed = payments.select(
        "key", functions.concat(functions.upper("value"), functions.lit(b"!")).alias("value")
    )
    return (
        transformed.writeStream.format("onceflow")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", f"spark-out-{name}")
        .option("deliveryGuarantee", guarantee)
        .option("checkpointLocation", str(args.work_dir / f"checkpoint-{name}"))
        .queryName(name.replace("-", "_"))
        .start()
    )


def run_until(query: Any, name: str, done: Callable[[Any], bool]) -> None:
    deadline = time.monotonic() + _QUERY_TIMEOUT_S
    try:
        while not done(query):
            if query.exception() is not None:
                raise SystemExit(f"query {name} failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise SystemExit(f"query {name} not done in {_QUERY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
    finally:
        query.stop()


def warm_up(spark: Any, args: argparse.Namespace, guarantee: str) -> None:
    """The query for WARM_UP_BATCHES batches (or the whole input, if shorter), untimed."""
    name = f"warm-up-{guarantee}"
    query = start_query(spark, args, guarantee, name)
    rows_needed = min(WARM_UP_BATCHES * args.max_offsets_per_trigger, args.records)

    def read_enough(query: Any) -> bool:
        return sum(progress["numInputRows"] for progress in query.recentProgress) >= rows_needed

    run_until(query, name, read_enough)


def stream(
    spark: Any, args: argparse.Namespace, guarantee: str, round_number: int, ends: dict[str, int]
) -> dict[str, Any]:
    """Run the query from the earliest offsets until a batch ends at `ends`; time it by its progress.

    The measured window runs from the end of the first batch to the end of the last one, so it
    leaves out the query's start-up and its first batch (Python workers, connections and, for
    exactly-once, the transactional producers' init); the records are those of the later batches.
    """
    name = f"{guarantee}-{round_number}"
    query = start_query(spark, args, guarantee, name)
    run_until(query, name, lambda query: reached(query.lastProgress, ends))
    batches = [progress for progress in query.recentProgress if progress["numInputRows"] > 0]
    rows = sum(progress["numInputRows"] for progress in batches)
    if rows != args.records:
        raise SystemExit(f"query {name} read {rows} rows, expected {args.records}")
    first, last = batches[0], batches[-1]
    seconds = batch_end(last) - batch_end(first)
    timed_records = rows - first["numInputRows"]
    return {
        "records": rows,
        "batches": len(batches),
        "timed_records": timed_records,
        "seconds": seconds,
        "records_per_s": timed_records / seconds,
        "first_batch_ms": first["durationMs"]["triggerExecution"],
        "batch_ms": [progress["durationMs"]["triggerExecution"] for progress in batches],
        "stage_ms": [stage_ms(progress["durationMs"]) for progress in batches],
    }


def stage_ms(duration_ms: dict[str, int]) -> dict[str, int]:
    stages = {stage: sum(duration_ms.get(timer, 0) for timer in timers) for stage, timers in STAGES.items()}
    stages["other"] = duration_ms["triggerExecution"] - sum(stages.values())
    return stages


def reached(progress: dict[str, Any] | None, ends: dict[str, int]) -> bool:
    if not progress or not progress["sources"]:
        return False
    end = progress["sources"][0]["endOffset"]
    offsets = json.loads(end) if isinstance(end, str) else end
    return bool(offsets) and next(iter(offsets.values())) == ends


def batch_end(progress: dict[str, Any]) -> float:
    started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return started + progress["durationMs"]["triggerExecution"] / 1000


def batch_read(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """`spark.read.format("onceflow")` of the whole topic, `count()`ed: one job, timed whole."""
    started = time.perf_counter()
    records = (
        spark.read.format("onceflow")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("maxPartitions", read_tasks(spark))
        .load()
        .count()
    )
    seconds = time.perf_counter() - started
    if records != args.records:
        raise SystemExit(f"the batch read counted {records} records, expected {args.records}")
    return {"records": records, "seconds": seconds, "records_per_s": records / seconds}


if __name__ == "__main__":
    sys.exit(main())
