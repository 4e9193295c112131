"""The Spark side of the pipeline: two streaming queries over the payments topic.

- `bookings` validates and enriches each payment and writes, with the onceflow sink, an order-status
  record and a seat-reservation record for a valid payment, or one payments-rejected record (the raw
  event with a `reason` header) for an invalid one. Each event becomes its rows by `explode`, with no
  shuffle, so both rows of a payment are written by the task that read the event, in its one
  transaction: a read_committed reader sees both or neither. Rejected events are kept, not dropped,
  so that nothing leaves the pipeline uncounted.
- `balances` adds the valid payments' amounts to per-account balances in a database, with the batch
  progress in the same transaction (`onceflow.spark.database.BalanceSink`).

Each query has its own checkpoint directory and runs at its own pace; both are exactly-once on their
own, so nothing ties their batches together. With the at-least-once guarantee the sink writes without
transactions and the balances are applied under a query id new to each run, so a batch replayed after
a crash counts twice, as a store without progress tracking would.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid

from onceflow.extras import MissingExtraError

try:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.query import StreamingQuery
except ImportError as error:
    raise MissingExtraError("onceflow pipeline run", "PySpark", "spark") from error

import onceflow.spark
from onceflow.pipeline.events import (
    CAPTURED,
    INPUT_TOPIC,
    ORDER_STATUS_TOPIC,
    REJECTED_TOPIC,
    SEAT_RESERVATIONS_TOPIC,
    ensure_output_topics,
)
from onceflow.pipeline.settings import BALANCES_QUERY_ID, EXACTLY_ONCE, PipelineSettings
from onceflow.spark.database import BalanceSink, check_fresh_start, checkpoint_has_batches
from onceflow.stores import open_store

# As on a cluster, where spark.task.maxFailures defaults to 4.
LOCAL_TASK_ATTEMPTS = 4
FIRST_BATCH_TIMEOUT_S = 120.0
PAYMENT_SCHEMA = (
    "payment_id string, account string, amount_cents long, flight string, seat string, status string"
)


def blank(column: Column) -> Column:
    return column.isNull() | (F.trim(column) == "")


def validated(raw: DataFrame) -> DataFrame:
    """The input rows with the parsed payment `p` and `reason`, null for a valid payment."""
    p = F.from_json(F.col("value").cast("string"), PAYMENT_SCHEMA)
    parsed = raw.withColumn("p", p)
    reason = (
        F.when(F.col("p").isNull() | blank(F.col("p.payment_id")), "not a JSON payment with a payment_id")
        .when(blank(F.col("p.account")), "no account")
        .when(F.col("p.amount_cents").isNull(), "amount_cents is not an integer")
        .when(F.col("p.amount_cents") <= 0, "amount_cents is not positive")
        .when(blank(F.col("p.flight")) | blank(F.col("p.seat")), "no flight or seat")
        .when(F.col("p.status") != CAPTURED, "status is not captured")
    )
    return parsed.withColumn("reason", reason)


def json_value(*fields: Column) -> Column:
    return F.to_json(F.struct(*fields)).cast("binary")


def header(name: str, value: Column) -> Column:
    return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))


def record(topic: str, key: Column, value: Column, headers: list[Column]) -> Column:
    return F.struct(
        F.lit(topic).alias("topic"),
        key.cast("binary").alias("key"),
        value.alias("value"),
        F.array(*headers).alias("headers"),
    )


def booking_records(payments: DataFrame) -> DataFrame:
    """Each event as its output rows (topic, key, value, headers), in the partition that read it."""
    source = F.format_string("%s-%d@%d", "topic", "partition", "offset")
    row_number = F.regexp_extract(F.col("p.seat"), r"^(\d+)", 1).cast("int")
    order = record(
        ORDER_STATUS_TOPIC,
        F.col("p.payment_id"),
        json_value(
            F.col("p.payment_id").alias("payment_id"),
            F.col("p.account").alias("account"),
            F.col("p.amount_cents").alias("amount_cents"),
            F.col("p.flight").alias("flight"),
            F.col("p.seat").alias("seat"),
            F.lit("confirmed").alias("status"),
            F.date_format("timestamp", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("paid_at"),
        ),
        [header("source", source)],
    )
    seat = record(
        SEAT_RESERVATIONS_TOPIC,
        F.concat_ws("/", F.col("p.flight"), F.col("p.seat")),
        json_value(
            F.col("p.payment_id").alias("payment_id"),
            F.col("p.flight").alias("flight"),
            F.col("p.seat").alias("seat"),
            F.when(row_number <= 5, "business").otherwise("economy").alias("cabin"),
            F.lit("reserved").alias("status"),
        ),
        [header("source", source)],
    )
    rejected = record(
        REJECTED_TOPIC,
        F.col("key"),
        F.col("value"),
        [header("source", source), header("reason", F.col("reason"))],
    )
    rows = F.when(F.col("reason").isNull(), F.array(order, seat)).otherwise(F.array(rejected))
    return validated(payments).select(F.explode(rows).alias("out")).select("out.*")


def valid_amounts(payments: DataFrame) -> DataFrame:
    """Account and amount of every event, null for an invalid one, which still counts for the
    offsets the balances sink stores; with the event's topic, partition and offset."""
    valid = F.col("reason").isNull()
    return validated(payments).select(
        F.when(valid, F.col("p.account")).alias("account"),
        F.when(valid, F.col("p.amount_cents")).alias("amount_cents"),
        "topic",
        "partition",
        "offset",
    )


def read_payments(spark: SparkSession, settings: PipelineSettings) -> DataFrame:
    reader = (
        spark.readStream.format(onceflow.spark.FORMAT)
        .option("kafka.bootstrap.servers", settings.bootstrap)
        .option("subscribe", INPUT_TOPIC)
        .option("startingOffsets", "earliest")
    )
    if settings.max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.max_offsets))
    return reader.load()


def with_task_retries(master: str) -> str:
    """`local[N]` as `local[N,4]`: a failed task gets the retries it gets on a cluster
    (spark.task.maxFailures), instead of failing the query at once, as plain local mode does."""
    single = re.fullmatch(r"local\[(\d+|\*)\]", master)
    return f"local[{single.group(1)},{LOCAL_TASK_ATTEMPTS}]" if single else master


def session(master: str) -> SparkSession:
    # Executors start this same interpreter, which has onceflow installed; Spark passes it along to
    # a standalone cluster's workers too.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(with_task_retries(master))
        .appName("onceflow-pipeline")
        .config("spark.ui.enabled", "false")
        # Only the balances' per-account sums shuffle, and they are small.
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.ui.showConsoleProgress", "false")
        # Spark's default, said out loud: the data source's clients live in its Python workers.
        .config("spark.python.worker.reuse", "true")
        .config(*onceflow.spark.DAEMON_MODULE)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    onceflow.spark.register(spark)
    return spark


def start_queries(spark: SparkSession, settings: PipelineSettings, sink: BalanceSink) -> list[StreamingQuery]:
    bookings = (
        booking_records(read_payments(spark, settings))
        .writeStream.format(onceflow.spark.FORMAT)
        .queryName("bookings")
        .option("kafka.bootstrap.servers", settings.bootstrap)
        .option("deliveryGuarantee", settings.guarantee)
        .option("checkpointLocation", settings.checkpoint_of("bookings"))
    )
    balances = (
        valid_amounts(read_payments(spark, settings))
        .writeStream.foreachBatch(sink)
        .queryName("balances")
        .option("checkpointLocation", settings.checkpoint_of("balances"))
    )
    if settings.trigger_ms is not None:
        bookings = bookings.trigger(processingTime=f"{settings.trigger_ms} milliseconds")
        balances = balances.trigger(processingTime=f"{settings.trigger_ms} milliseconds")
    started = bookings.start()
    # One query's first batch before the other starts: Spark 4.3 once failed the first tasks of
    # two Python-source queries planned at the same moment (java.io.OptionalDataException).
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT_S
    while started.isActive and started.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return [started, balances.start()]


class IdleWatch:
    """Says when every query has caught up and stayed so for a while: each has finished a batch in
    this run that reached the source's latest offsets, none has new data, and no end offset moved."""

    def __init__(self, queries: list[StreamingQuery], idle_s: float) -> None:
        self.queries = queries
        self.idle_s = idle_s
        self.last_seen: list[object] = []
        self.since = time.monotonic()

    def idle(self) -> bool:
        seen: list[object] = []
        for query in self.queries:
            progress = query.lastProgress
            source = progress["sources"][0] if progress and progress["sources"] else None
            caught_up = source is not None and source["endOffset"] == source["latestOffset"]
            if not caught_up or query.status["isDataAvailable"]:
                seen.append(time.monotonic())  # busy or not started: always counts as a change
            seen.append(source["endOffset"] if source else None)
        if seen != self.last_seen:
            self.last_seen, self.since = seen, time.monotonic()
        return time.monotonic() - self.since >= self.idle_s


def run_pipeline(settings: PipelineSettings) -> int:
    """Run both queries until one fails or, with `until_idle_s`, until the input stays idle."""
    ensure_output_topics(settings.bootstrap)
    if settings.guarantee == EXACTLY_ONCE:
        query_id = BALANCES_QUERY_ID
    else:
        query_id = f"{BALANCES_QUERY_ID}-{uuid.uuid4()}"
    spark = session(settings.master)
    balances_checkpoint = settings.checkpoint_of("balances")
    with open_store(settings.db) as store:
        check_fresh_start(
            store, query_id, balances_checkpoint, checkpoint_has_batches(spark, balances_checkpoint)
        )
    queries = start_queries(spark, settings, BalanceSink(settings.db, query_id))
    print(f"pipeline running: {', '.join(f'{q.name} {q.id}' for q in queries)}", flush=True)
    watch = IdleWatch(queries, settings.until_idle_s) if settings.until_idle_s is not None else None
    # awaitAnyTermination raises the failure of a query that failed.
    while not spark.streams.awaitAnyTermination(1):
        if watch is not None and watch.idle():
            print(f"pipeline idle for {watch.idle_s:g} s: stopping", flush=True)
            break
    for query in queries:
        query.stop()
    spark.stop()
    return 0
