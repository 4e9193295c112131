"""Spark side of the `spark` benchmark: one local[2] session that runs what the harness asks for.

    spark_job.py --bootstrap HOST:PORT --topic T --partitions 4 --records N
                 --max-offsets-per-trigger M --work-dir DIR

Starts the session, prints one JSON line ({"ready": ...}), then reads one JSON command per line
on stdin and answers each with one JSON line on stdout, so that the harness can run other
things (quixstreams, a plain consumer) between the Spark runs, alternately:

    {"command": "warm-up"}                     both guarantees' query for a few batches, untimed
    {"command": "stream", "guarantee": G, "name": N}   the query to the input's end, timed
    {"command": "read", "warm_ups": K}         K untimed batch reads, then one timed, values aggregated
    {"command": "small-read"}                  a batch read of a few records: a user's warm-up
    {"command": "stop"}

Every run also says where its tasks' time went: each Python task's stages
(`onceflow.spark.task_times`, written to a file of this job's) and the JVM's share of the tasks
(the executor's run and CPU time per task, from Spark's own status store).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
# A user's warm-up before the first real read: this many records per partition.
SMALL_READ_RECORDS_PER_PARTITION = 250


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--max-offsets-per-trigger", type=int, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    # Executors run this interpreter, which has onceflow; loopback only, whatever the host name.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    task_times = args.work_dir / f"task-times-{os.getpid()}.jsonl"
    task_times.touch()
    os.environ["ONCEFLOW_SPARK_TASK_TIMES"] = str(task_times)  # the workers inherit it
    started = time.perf_counter()
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
        .config(*onceflow.spark.DAEMON_MODULE)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    onceflow.spark.register(spark)
    job = Job(spark, args, task_times)
    try:
        ends = end_offsets(args.bootstrap, args.topic, args.partitions)
        if sum(ends.values()) != args.records:
            raise SystemExit(
                f"topic {args.topic} holds {sum(ends.values())} records, expected {args.records}"
            )
        job.ends = ends
        answer({"ready": True, "session_start_s": time.perf_counter() - started})
        for line in sys.stdin:
            command = json.loads(line)
            if command["command"] == "stop":
                break
            answer(job.run(command))
    finally:
        spark.stop()
    return 0


def answer(figures: dict[str, Any]) -> None:
    print(json.dumps(figures), flush=True)


class Job:
    def __init__(self, spark: Any, args: argparse.Namespace, task_times: Path) -> None:
        self.spark = spark
        self.args = args
        self.task_times = task_times
        self.ends: dict[str, int] = {}

    def run(self, command: dict[str, Any]) -> dict[str, Any]:
        name = command["command"]
        if name == "warm-up":
            for guarantee in GUARANTEES:
                warm_up(self.spark, self.args, guarantee)
            return {}
        if name == "stream":
            return self.measured(
                lambda: stream(self.spark, self.args, command["guarantee"], command["name"], self.ends)
            )
        if name == "read":
            warm_ups = [batch_read(self.spark, self.args) for _ in range(command["warm_ups"])]
            return {**self.measured(lambda: batch_read(self.spark, self.args)), "warm_ups": warm_ups}
        if name == "small-read":
            ending = {
                self.args.topic: {
                    str(p): SMALL_READ_RECORDS_PER_PARTITION for p in range(self.args.partitions)
                }
            }
            return batch_read(self.spark, self.args, json.dumps(ending))
        raise SystemExit(f"unknown command {name!r}")

    def measured(self, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`run`'s figures, with its tasks' stages (Python's from the task-times file, the JVM's
        from the status store), medians per task over the stages and tasks after the first."""
        status = self.spark.sparkContext._jsc.sc().statusStore()
        first_stage = _next_stage_id(status)
        position = self.task_times.stat().st_size
        figures = run()
        with self.task_times.open() as lines:
            lines.seek(position)
            tasks = [json.loads(line) for line in lines]
        stages = _stages_since(status, first_stage)
        first_batch = min((task["batch"] for task in tasks if task.get("batch") is not None), default=None)
        if first_batch is not None:  # a stream: its first batch is out of the timed window
            tasks = [task for task in tasks if task.get("batch") != first_batch]
            stages = stages[1:]
        else:  # a read: the scan's stage, not the aggregate's last step
            stages = stages[:1]
        return {**figures, "python_tasks": python_task_stages(tasks), "jvm_tasks": jvm_task_times(stages)}


def python_task_stages(tasks: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kind of task (read, write, keeper write): the median ms per task of each stage, of
    the whole task, and the median records per task."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        kinds.setdefault(task["kind"], []).append(task)
    medians = {}
    for kind, runs in kinds.items():
        stages = sorted({stage for task in runs for stage in task["stages_s"]})
        medians[kind] = {
            "tasks": len(runs),
            "records": statistics.median(task["records"] for task in runs),
            "total_ms": statistics.median(task["total_s"] for task in runs) * 1000,
            **{
                f"{stage}_ms": statistics.median(task["stages_s"].get(stage, 0.0) for task in runs) * 1000
                for stage in stages
            },
        }
    return medians


def _all_stages(status: Any) -> list[Any]:
    """Every stage the store keeps (`AppStatusStore.stageList`, its defaults spelled out)."""
    listed = status.stageList(
        None, False, False, getattr(status, "stageList$default$4")(), getattr(status, "stageList$default$5")()
    )
    return [listed.apply(index) for index in range(int(listed.size()))]


def _next_stage_id(status: Any) -> int:
    return max((int(stage.stageId()) for stage in _all_stages(status)), default=-1) + 1


def _stages_since(status: Any, first: int) -> list[dict[str, float]]:
    """The Spark stages from id `first` on that ended, oldest first: per task, the run time and
    the CPU time of the executor's thread (the JVM's side of a Python task: reading the reader's
    Arrow batches, the query's expressions, the writer's Arrow batches)."""
    stages = []
    for stage in _all_stages(status):
        tasks = int(stage.numCompleteTasks())
        if int(stage.stageId()) < first or not tasks:
            continue
        stages.append(
            {
                "stage_id": int(stage.stageId()),
                "tasks": tasks,
                "run_ms": int(stage.executorRunTime()) / tasks,
                "cpu_ms": int(stage.executorCpuTime()) / 1e6 / tasks,
                "deserialize_ms": int(stage.executorDeserializeTime()) / tasks,
                "gc_ms": int(stage.jvmGcTime()) / tasks,
            }
        )
    return sorted(stages, key=lambda stage: stage["stage_id"])


def jvm_task_times(stages: list[dict[str, float]]) -> dict[str, float]:
    if not stages:
        return {}
    keys = ("run_ms", "cpu_ms", "deserialize_ms", "gc_ms")
    return {"stages": len(stages), **{key: statistics.median(stage[key] for stage in stages) for key in keys}}


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
    spark: Any, args: argparse.Namespace, guarantee: str, name: str, ends: dict[str, int]
) -> dict[str, Any]:
    """Run the query from the earliest offsets until a batch ends at `ends`; time it by its progress.

    The measured window runs from the end of the first batch to the end of the last one, so it
    leaves out the query's start-up and its first batch (Python workers, connections and, for
    exactly-once, the transactional producers' init); the records are those of the later batches.
    """
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
        "output_topic": f"spark-out-{name}",
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


def batch_read(spark: Any, args: argparse.Namespace, ending: str = "latest") -> dict[str, Any]:
    """`spark.read.format("onceflow")` of the topic with its values used, as a user's first look
    at a topic does (`count`, `sum(length(value))`): one job, timed whole."""
    from pyspark.sql import functions

    started = time.perf_counter()
    frame = (
        spark.read.format("onceflow")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("endingOffsets", ending)
        .option("maxPartitions", read_tasks(spark))
        .load()
    )
    records, payload = frame.agg(functions.count("*"), functions.sum(functions.length("value"))).first()
    seconds = time.perf_counter() - started
    if ending == "latest" and records != args.records:
        raise SystemExit(f"the batch read counted {records} records, expected {args.records}")
    return {"records": records, "bytes": payload, "seconds": seconds, "records_per_s": records / seconds}


if __name__ == "__main__":
    sys.exit(main())
