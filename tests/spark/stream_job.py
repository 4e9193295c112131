"""A streaming query for the kill/restart tests: onceflow source -> flaky transform -> onceflow sink.

Run as a script, so the transform is pickled by value and needs no import path on the workers.
It prints one JSON line per finished micro-batch with the source's end offsets, and runs until
it is killed. Some first task attempts fail after they have produced all their rows (faults in
--faults-dir record each one); with --slow-first-attempts, some first attempts stall instead
until a speculative copy of theirs runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql import SparkSession

import onceflow.spark


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--faults-dir", required=True)
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--guarantee", default="exactly-once")
    # Three or four micro-batches for the tests' ~7000 offsets, each with failed (or slow) first
    # attempts, as batches of 1000 had (the three tests: 115 s against 132 s, one run each).
    parser.add_argument("--max-offsets", type=int, default=2500)
    parser.add_argument("--slow-first-attempts", action="store_true")
    parser.add_argument("--max-partitions", help="the source's maxPartitions (default: a task per partition)")
    args = parser.parse_args()

    builder = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
        .config("spark.python.worker.reuse", "true")
        .config(*onceflow.spark.DAEMON_MODULE)
    )
    if args.slow_first_attempts:
        builder = (
            builder.config("spark.speculation", "true")
            .config("spark.speculation.interval", "100ms")
            .config("spark.speculation.multiplier", "1.5")
            .config("spark.speculation.quantile", "0.25")
            .config("spark.speculation.minTaskRuntime", "500ms")
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    onceflow.spark.register(spark)
    faults_dir = args.faults_dir
    slow = args.slow_first_attempts

    def flaky_transform(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        assert context is not None
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        first_attempt = context.attemptNumber() == 0
        chosen = (int(batch_id or 0) + context.partitionId()) % 3 == 0
        task = f"{faults_dir}/b{batch_id}-p{context.partitionId()}"
        fault = f"{task}-a{context.attemptNumber()}"
        if not first_attempt:
            Path(fault + "-retry").touch()
        for batch in batches:
            value = pc.binary_join_element_wise(batch.column("value"), pa.scalar(b"|done"), pa.scalar(b""))
            yield pa.RecordBatch.from_arrays([batch.column("key"), value], names=["key", "value"])
        if first_attempt and chosen and slow:
            Path(fault + "-slow").touch()
            # Until a speculative copy runs (at most a minute), however slowly it starts on a busy
            # machine: a fixed stall let the first attempt finish before its copy now and then.
            deadline = time.monotonic() + 60
            while (
                not list(Path(faults_dir).glob(f"{Path(task).name}-a*-retry")) and time.monotonic() < deadline
            ):
                time.sleep(0.1)
        elif first_attempt and chosen:
            # After every row has gone downstream, so an at-least-once sink has sent them.
            Path(fault + "-failed").touch()
            time.sleep(0.5)
            raise RuntimeError("injected task failure")

    source = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", "input")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets)
    )
    if args.max_partitions is not None:
        source = source.option("maxPartitions", args.max_partitions)
    query = (
        source.load()
        .select("key", "value")
        .mapInArrow(flaky_transform, "key binary, value binary")
        .writeStream.format("onceflow")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", "output")
        .option("deliveryGuarantee", args.guarantee)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    reported = -1
    while query.isActive:
        progress = query.lastProgress
        if progress is not None and progress["batchId"] != reported:
            reported = progress["batchId"]
            end = json.loads(progress["sources"][0]["endOffset"] or "{}")
            print(json.dumps({"batch": reported, "end": end}), flush=True)
        time.sleep(0.2)
    query.awaitTermination()


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
