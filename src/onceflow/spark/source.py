"""The onceflow source: Kafka topics read with read_committed, for batch and streaming queries.

The planning half (offsets, partitions) runs on the driver, in one long-lived Python worker;
`read_range` runs on executors. Offsets live only in Spark's checkpoint.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from onceflow.spark.options import (
    Offsets,
    OptionError,
    Subscription,
    client_config,
    parse_offsets_json,
    sorted_offsets,
)

SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
EARLIEST, LATEST = -2, -1
ROWS_PER_ARROW_BATCH = 10_000
METADATA_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Kafka partition's records in [start, end); end is a last stable offset."""

    topic: str
    partition: int
    start: int
    end: int


class OffsetPlanner:
    """Driver side: which partitions exist and where they begin and end for read_committed."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.config = client_config(options)
        self.subscription = Subscription(options)
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(reader_config(self.config))
        return self._consumer

    def bounds(self) -> tuple[Offsets, Offsets]:
        """Earliest offset and LSO of every partition of every subscribed topic."""
        earliest: Offsets = {}
        latest: Offsets = {}
        for topic, count in self.subscription.partitions(self.consumer, METADATA_TIMEOUT_S).items():
            earliest[topic], latest[topic] = {}, {}
            for partition in range(count):
                # With isolation.level=read_committed the high mark librdkafka returns is the LSO.
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
                )
                earliest[topic][str(partition)], latest[topic][str(partition)] = low, high
        return sorted_offsets(earliest), sorted_offsets(latest)

    def resolve(self, spec: str, option: str) -> Offsets:
        """`earliest`, `latest` or JSON offsets (with -2/-1 meaning earliest/latest) made concrete."""
        earliest, latest = self.bounds()
        if spec == "earliest":
            return earliest
        if spec == "latest":
            return latest
        wanted = parse_offsets_json(spec, option)
        resolved: Offsets = {}
        for topic, partitions in wanted.items():
            if topic not in latest:
                raise OptionError(f"option {option!r} names topic {topic!r}, which is not subscribed")
            resolved[topic] = {}
            for partition, offset in partitions.items():
                if partition not in latest[topic]:
                    raise OptionError(f"option {option!r}: {topic} has no partition {partition}")
                bound = {EARLIEST: earliest, LATEST: latest}.get(offset)
                resolved[topic][partition] = bound[topic][partition] if bound else offset
        return sorted_offsets(resolved)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def offset_ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    """One range per partition with something to read. A partition new since `start` starts at 0."""
    return [
        OffsetRange(topic, int(partition), start.get(topic, {}).get(partition, 0), stop)
        for topic, partitions in end.items()
        for partition, stop in partitions.items()
        if start.get(topic, {}).get(partition, 0) < stop
    ]


def limit_offsets(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """At most `max_rows` offsets past `start`, shared out by each partition's backlog."""
    backlog = {
        (topic, partition): stop - start.get(topic, {}).get(partition, 0)
        for topic, partitions in latest.items()
        for partition, stop in partitions.items()
    }
    total = sum(max(lag, 0) for lag in backlog.values())
    if total <= max_rows:
        return latest
    limited: Offsets = {}
    for (topic, partition), lag in backlog.items():
        begin = latest[topic][partition] - lag
        # At least one offset per partition with a backlog, so that no partition starves.
        share = max(1, lag * max_rows // total) if lag > 0 else 0
        limited.setdefault(topic, {})[partition] = begin + share
    return sorted_offsets(limited)


def reader_config(config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **config,
        "group.id": config.get("group.id", f"onceflow-reader-{uuid.uuid4()}"),
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    }


def read_range(
    config: Mapping[str, Any], offsets: InputPartition, stall_timeout_s: float
) -> Iterator[pa.RecordBatch]:
    """Yield the committed records of `offsets` as Arrow batches.

    Markers and aborted data leave gaps, so the read ends when a record at or past `end` arrives or
    the consumer reaches the end of the partition (its LSO, which is at least `end`), never by count.
    """
    if not isinstance(offsets, OffsetRange):
        return  # Spark plans one empty partition when there is nothing to read
    consumer = Consumer(reader_config(config))
    consumer.assign([TopicPartition(offsets.topic, offsets.partition, offsets.start)])
    rows = _Columns()
    last_progress = time.monotonic()
    try:
        while True:
            done = False
            messages = consumer.consume(num_messages=ROWS_PER_ARROW_BATCH, timeout=1.0)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    done = True
                    break
                if message.offset() >= offsets.end:  # type: ignore[operator]
                    done = True
                    break
                rows.add(message)
            if messages:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout_s:
                raise TimeoutError(
                    f"no progress reading {offsets.topic}-{offsets.partition} "
                    f"[{offsets.start}, {offsets.end}) for {stall_timeout_s:.0f} s"
                )
            if rows.count >= ROWS_PER_ARROW_BATCH or (done and rows.count):
                yield rows.flush()
            if done:
                return
    finally:
        consumer.close()


class _Columns:
    """Records gathered column by column, so a batch converts to Arrow in one step."""

    def __init__(self) -> None:
        self.count = 0
        self._columns: list[list[Any]] = [[] for _ in ARROW_SCHEMA]

    def add(self, message: Message) -> None:
        kind, millis = message.timestamp()
        headers = message.headers() or []
        row = (
            message.key(),
            message.value(),
            message.topic(),
            message.partition(),
            message.offset(),
            millis * 1000 if kind else None,
            # confluent-kafka: 1 create time, 2 log append time; Spark's Kafka source: 0 and 1.
            kind - 1 if kind else -1,
            [{"key": key, "value": value} for key, value in headers],  # type: ignore[str-unpack]
        )
        for column, value in zip(self._columns, row, strict=True):
            column.append(value)
        self.count += 1

    def flush(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(column, type=field.type)
                for column, field in zip(self._columns, ARROW_SCHEMA, strict=True)
            ],
            schema=ARROW_SCHEMA,
        )
        self.__init__()  # type: ignore[misc]
        return batch


def stall_timeout(options: Mapping[str, str]) -> float:
    return float(options.get("readStallTimeoutMs", "120000")) / 1000


class OnceflowBatchReader(DataSourceReader):
    """`spark.read.format("onceflow")`: startingOffsets (default earliest) to endingOffsets (latest)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options  # Spark's case-insensitive mapping: keep it, keys and all
        planner = OffsetPlanner(options)
        try:
            start = planner.resolve(options.get("startingOffsets", "earliest"), "startingOffsets")
            end = planner.resolve(options.get("endingOffsets", "latest"), "endingOffsets")
        finally:
            planner.close()
        self.ranges = offset_ranges(start, end)

    def partitions(self) -> list[OffsetRange]:
        return self.ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(client_config(self.options), partition, stall_timeout(self.options))


class OnceflowStreamReader(DataSourceStreamReader):
    """`spark.readStream.format("onceflow")`: each micro-batch ends at the partitions' LSOs."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options  # Spark's case-insensitive mapping: keep it, keys and all
        self.planner = OffsetPlanner(options)
        max_rows = options.get("maxOffsetsPerTrigger")
        if max_rows is not None and (not max_rows.isdigit() or int(max_rows) < 1):
            raise OptionError(f"option 'maxOffsetsPerTrigger' must be a positive integer, not {max_rows!r}")
        self.max_rows = int(max_rows) if max_rows is not None else None

    def initialOffset(self) -> Offsets:
        return self.planner.resolve(self.options.get("startingOffsets", "latest"), "startingOffsets")

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows is not None else ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        _, latest = self.planner.bounds()
        # A topic or partition that vanished keeps its last offset: offsets never move back.
        for topic, partitions in start.items():
            for partition, offset in partitions.items():
                latest.setdefault(topic, {}).setdefault(partition, offset)
        latest = sorted_offsets(latest)
        if isinstance(limit, ReadMaxRows):
            return limit_offsets(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> Offsets:
        return self.planner.bounds()[1]

    def partitions(self, start: Offsets, end: Offsets) -> list[OffsetRange]:
        return offset_ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(client_config(self.options), partition, stall_timeout(self.options))

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        self.planner.close()
