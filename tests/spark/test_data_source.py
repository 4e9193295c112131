"""The onceflow data source in a local Spark session against an embedded broker."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from hypothesis import given
from hypothesis import strategies as st
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow import EmbeddedBroker
from onceflow.admin.client import Cluster
from onceflow.spark.source import limit_offsets
from tests.spark.helpers import produce_transactions
from tests.support import read_to_end, values

pytestmark = pytest.mark.spark


def create(bootstrap: str, *topics: tuple[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, count, 1) for name, count in topics]).values():
        future.result(timeout=30)


def reader(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    read = spark.read.format("onceflow").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        read = read.option(key, value)
    return read.load()


def test_batch_read_skips_aborted_data_and_markers(spark: SparkSession, broker: EmbeddedBroker) -> None:
    create(broker.bootstrap_servers, ("in", 3))
    all_values = [f"v{n}" for n in range(900)]
    committed = produce_transactions(broker.bootstrap_servers, "in", all_values, 100, 3, "feed")
    frame = reader(spark, broker.bootstrap_servers, subscribe="in")
    rows = frame.collect()
    assert sorted(row.value.decode() for row in rows) == sorted(committed)
    assert {row.topic for row in rows} == {"in"}
    assert {row.timestampType for row in rows} == {0}
    # Markers and aborted batches leave gaps: the offsets read are not contiguous.
    offsets = sorted(row.offset for row in rows if row.partition == 0)
    assert offsets[-1] + 1 > len(offsets)


def test_batch_read_in_fewer_tasks_than_partitions(spark: SparkSession, broker: EmbeddedBroker) -> None:
    create(broker.bootstrap_servers, ("in", 5))
    all_values = [f"v{n}" for n in range(500)]
    committed = produce_transactions(broker.bootstrap_servers, "in", all_values, 100, 3, "feed")
    frame = reader(spark, broker.bootstrap_servers, subscribe="in", maxPartitions="2")
    assert frame.rdd.getNumPartitions() == 2
    rows = frame.collect()
    assert sorted(row.value.decode() for row in rows) == sorted(committed)
    assert {row.partition for row in rows} == set(range(5))


def test_batch_read_between_json_offsets(spark: SparkSession, broker: EmbeddedBroker) -> None:
    create(broker.bootstrap_servers, ("in", 1))
    produce_transactions(broker.bootstrap_servers, "in", [f"v{n}" for n in range(10)], 10, 0, "feed")
    # Offsets 0-9 are the records and 10 the commit marker.
    frame = reader(
        spark,
        broker.bootstrap_servers,
        subscribe="in",
        startingOffsets='{"in": {"0": 3}}',
        endingOffsets='{"in": {"0": 7}}',
    )
    assert [row.value for row in frame.collect()] == [b"v3", b"v4", b"v5", b"v6"]


def test_stream_stops_at_an_open_transaction_and_picks_up_new_partitions(
    spark: SparkSession, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 2), ("out", 2))
    produce_transactions(bootstrap, "in", [f"a{n}" for n in range(50)], 50, 0, "feed")

    hanging = Producer({"bootstrap.servers": bootstrap, "transactional.id": "open"})
    hanging.init_transactions(30)
    hanging.begin_transaction()
    hanging.produce("in", value=b"uncommitted", partition=0)
    hanging.flush(30)
    query = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .load()
        .select("value")
        .writeStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
        assert sorted(values(read_to_end(bootstrap, "out", 2, "read_committed"))) == sorted(
            f"a{n}" for n in range(50)
        )
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_partitions([NewPartitions("in", 4)])["in"].result(timeout=30)
        produce_transactions(bootstrap, "in", [f"b{n}" for n in range(40)], 40, 0, "feed-2")
        hanging.commit_transaction(30)
        query.processAllAvailable()
    finally:
        query.stop()
    output = Counter(values(read_to_end(bootstrap, "out", 2, "read_committed")))
    expected = Counter([f"a{n}" for n in range(50)] + [f"b{n}" for n in range(40)] + ["uncommitted"])
    assert output == expected


def test_bad_options_fail_with_a_clear_message(spark: SparkSession, broker: EmbeddedBroker) -> None:
    with pytest.raises(PySparkException, match=r"kafka\.bootstrap\.servers"):
        spark.read.format("onceflow").option("subscribe", "x").load().collect()
    with pytest.raises(
        PySparkException, match="exactly one of the options 'subscribe' and 'subscribePattern'"
    ):
        reader(spark, broker.bootstrap_servers).collect()
    with pytest.raises(PySparkException, match="startingOffsets"):
        reader(spark, broker.bootstrap_servers, subscribe="x", startingOffsets="{oops").collect()
    with pytest.raises(PySparkException, match="option 'maxPartitions' must be a positive integer"):
        reader(spark, broker.bootstrap_servers, subscribe="x", maxPartitions="0").collect()
    frame = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(PySparkException, match="needs a 'value' column"):
        frame.write.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap_servers).option(
            "topic", "t"
        ).mode("append").save()


def test_batch_write_exactly_once(spark: SparkSession, broker: EmbeddedBroker) -> None:
    create(broker.bootstrap_servers, ("written", 2))
    # Two writes under one transactional id prefix: each is batch 0 of its own, so the second
    # must not take the first one's progress for its own and skip its rows.
    for first in (0, 200):
        frame = spark.createDataFrame(
            [(f"r{n}", str(n % 2)) for n in range(first, first + 200)], "value string, key string"
        )
        frame.repartition(3).write.format("onceflow").option(
            "kafka.bootstrap.servers", broker.bootstrap_servers
        ).option("topic", "written").option("transactionalIdPrefix", "batch").mode("append").save()
    assert Counter(values(read_to_end(broker.bootstrap_servers, "written", 2, "read_committed"))) == Counter(
        f"r{n}" for n in range(400)
    )


backlogs = st.dictionaries(
    st.sampled_from(["0", "1", "2", "3"]), st.tuples(st.integers(0, 1000), st.integers(0, 500))
)


@given(backlogs, st.integers(1, 2000))
def test_limit_offsets_never_moves_back_and_caps_the_batch(
    partitions: dict[str, tuple[int, int]], cap: int
) -> None:
    start = {"t": {partition: begin for partition, (begin, _) in partitions.items()}}
    latest = {"t": {partition: begin + lag for partition, (begin, lag) in partitions.items()}}
    limited = limit_offsets(start, latest, cap)
    total = 0
    for partition, (begin, lag) in partitions.items():
        end = limited.get("t", {}).get(partition, begin)
        assert begin <= end <= begin + lag
        total += end - begin
    backlog = sum(lag for _, lag in partitions.values())
    # Each partition with a backlog advances by at least one, so the cap can be exceeded by that much.
    assert total <= max(cap, 0) + len(partitions)
    assert total == backlog or total >= min(cap, backlog) - len(partitions)


def test_a_write_longer_than_the_transaction_timeout_fails_fast(
    spark: SparkSession, broker: EmbeddedBroker
) -> None:
    create(broker.bootstrap_servers, ("slow", 1))

    def slowly(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Rows trickle in for 3 s, so the write is slow even when its own worker starts late.
        for batch in batches:
            for _ in range(2):
                yield batch.slice(0, 0)
                time.sleep(1.5)
            yield batch

    frame = spark.createDataFrame([("x",)], "value string").mapInArrow(slowly, "value string")
    with pytest.raises(PySparkException, match=r"does not fit in kafka\.transaction\.timeout\.ms=1000"):
        frame.write.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap_servers).option(
            "topic", "slow"
        ).option("kafka.transaction.timeout.ms", "1000").mode("append").save()
    assert values(read_to_end(broker.bootstrap_servers, "slow", 1, "read_committed")) == []


def test_a_write_task_killed_between_two_arrow_batches_commits_none_of_them(
    spark: SparkSession, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """A killed task's JVM closes its Python worker's socket without killing the worker, and a
    cut between two Arrow batches reads as the end of the stream. The sink must not commit
    then: the batch would count as done with part of its rows, and its rerun would skip the
    rest."""
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 1), ("out", 1))
    producer = Producer({"bootstrap.servers": bootstrap})
    inputs = [f"{n:04d}" + "x" * 1000 for n in range(300)] + ["stall"] + [f"after{n}" for n in range(50)]
    for value in inputs:
        producer.produce("in", value=value)
    producer.flush(30)

    def run(value: str) -> StreamingQuery:
        return (
            spark.readStream.format("onceflow")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr(f"{value} AS value")
            .writeStream.format("onceflow")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", "out")
            .option("transactionalIdPrefix", "cut")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )

    text = "CAST(value AS STRING)"
    # The JVM sleeps on one row, after the sink got batches of the rows before it; stopping the
    # query interrupts the sleep, so the task ends at once and Spark closes the worker's socket.
    # It sleeps longer than the wait below, which a loaded machine may need whole.
    stall = "reflect('java.lang.Thread', 'sleep', CAST(300000 AS BIGINT))"
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        query = run(f"CASE WHEN {text} = 'stall' THEN concat({text}, {stall}) ELSE {text} END")
        try:
            wait_until(lambda: high_watermark(bootstrap, "out") > 0, 180, "the sink to produce")
        finally:
            query.stop()
        with Cluster(bootstrap, 10) as cluster:
            ended: list[str] = []

            def transaction_ended() -> bool:
                ended.append(cluster.describe_transactions(["cut-0"])["cut-0"].state)
                return ended[-1].startswith("Complete")

            wait_until(transaction_ended, 30, "the killed task's transaction to end")
        assert ended[-1] == "CompleteAbort"
        query = run(text)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert Counter(values(read_to_end(bootstrap, "out", 1, "read_committed"))) == Counter(inputs)


def high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "watermark", "isolation.level": "read_uncommitted"}
    )
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        consumer.close()


def wait_until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
