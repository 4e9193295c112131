"""The onceflow source: Kafka topics read with read_committed, for batch and streaming queries.

The planning half (offsets, partitions) runs on the driver, in one long-lived Python worker;
`read_range` runs on executors. Offsets live only in Spark's checkpoint.
"""

from __future__ import annotations

import bisect
import json
import operator
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy
import pyarrow as pa
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from onceflow.spark.collector import collector_paused, freeze_between_tasks
from onceflow.spark.options import (
    QUICK_START,
    Offsets,
    OptionError,
    Subscription,
    client_config,
    parse_offsets_json,
    positive_int,
    sorted_offsets,
)
from onceflow.spark.rows import (
    ARROW_SCHEMA,
    HEADERS,
    MICROS,
    MILLIS,
    NO_HEADER_FIELDS,
    ROWS_PER_ARROW_BATCH,
    batch_of_columns,
)
from onceflow.spark.task_times import StageClock, batch_id

if TYPE_CHECKING:
    from onceflow.spark.fetching import Fetcher

EARLIEST, LATEST = -2, -1
CONSUME_WAIT_S = 0.05
FETCH_WAIT_MS = 1
FETCH_QUEUE_BACKOFF_MS = 10
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
        self._admin: AdminClient | None = None

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.config)
        return self._admin

    def latest(self) -> Offsets:
        """The LSO of every partition of every subscribed topic: a metadata request, then one
        ListOffsets request per leader for all partitions at once."""
        counts = self.subscription.partitions(self.admin, METADATA_TIMEOUT_S)
        return self._list_offsets(OffsetSpec.latest(), counts)  # type: ignore[no-untyped-call]

    def bounds(self) -> tuple[Offsets, Offsets]:
        """Earliest offset and LSO of every partition of every subscribed topic."""
        # One listing for both, so that both name the same partitions.
        counts = self.subscription.partitions(self.admin, METADATA_TIMEOUT_S)
        return (
            self._list_offsets(OffsetSpec.earliest(), counts),  # type: ignore[no-untyped-call]
            self._list_offsets(OffsetSpec.latest(), counts),  # type: ignore[no-untyped-call]
        )

    def _list_offsets(self, spec: OffsetSpec, counts: Mapping[str, int]) -> Offsets:
        wanted = {TopicPartition(topic, p): spec for topic, count in counts.items() for p in range(count)}
        offsets: Offsets = {topic: {} for topic in counts}
        if not wanted:
            return offsets
        # With read_committed the latest offset the broker answers is the LSO.
        futures = self.admin.list_offsets(
            wanted, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=METADATA_TIMEOUT_S
        )
        for tp, future in futures.items():
            offsets[tp.topic][str(tp.partition)] = future.result(timeout=METADATA_TIMEOUT_S).offset
        return sorted_offsets(offsets)

    def resolve(self, spec: str, option: str, bounds: tuple[Offsets, Offsets] | None = None) -> Offsets:
        """`earliest`, `latest` or JSON offsets (with -2/-1 meaning earliest/latest) made concrete,
        against `bounds` if given (one listing for several specs), else fresh ones."""
        earliest, latest = bounds if bounds is not None else self.bounds()
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
        """Nothing to release: an AdminClient has no group or assignment to leave."""
        self._admin = None


def offset_ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    """One range per partition with something to read. A partition new since `start` starts at 0."""
    return [
        OffsetRange(topic, int(partition), start.get(topic, {}).get(partition, 0), stop)
        for topic, partitions in end.items()
        for partition, stop in partitions.items()
        if start.get(topic, {}).get(partition, 0) < stop
    ]


@dataclass(frozen=True)
class ReadTask(InputPartition):
    """Several partitions' ranges for one read task, read one after another."""

    ranges: tuple[OffsetRange, ...]


def read_tasks(ranges: list[OffsetRange], max_tasks: int | None) -> list[InputPartition]:
    """A task per range, or at most `max_tasks`: the largest range first, each to the task with
    the fewest offsets so far, each task's ranges then in (topic, partition) order. Spark runs a
    Python data source's task at a cost of tens of ms, whatever its size, so a small cluster reads
    faster with no more tasks than cores. Decided by the ranges alone: a replayed batch gives
    every task the rows it gave it before."""
    if max_tasks is None or len(ranges) <= max_tasks:
        return list(ranges)
    loads = [0] * max_tasks
    members: list[list[OffsetRange]] = [[] for _ in range(max_tasks)]
    # A stable sort: ranges of equal size keep their (topic, partition) order.
    for offsets in sorted(ranges, key=lambda offsets: offsets.end - offsets.start, reverse=True):
        lightest = loads.index(min(loads))
        loads[lightest] += offsets.end - offsets.start
        members[lightest].append(offsets)
    return [
        ReadTask(tuple(sorted(task, key=lambda offsets: (offsets.topic, offsets.partition))))
        for task in members
    ]


def read_task(
    config: Mapping[str, Any], task: InputPartition, stall_timeout_s: float
) -> Iterator[pa.RecordBatch]:
    """The records of a planned task: one range, or a ReadTask's ranges, fetched together over
    plain connections (`onceflow.spark.fetching`), else through confluent-kafka one after another."""
    freeze_between_tasks()
    clock = StageClock("read")
    records = 0
    # Spark plans one empty partition when there is nothing to read.
    planned = task.ranges if isinstance(task, ReadTask) else (task,)
    ranges = [offsets for offsets in planned if isinstance(offsets, OffsetRange)]
    # Imported by the tasks that read, not by every process that unpickles the data source (the
    # driver's planning workers): its Kafka protocol (kio) takes 0.2 s to import, 0.45 s with
    # Hypothesis installed.
    from onceflow.spark.fetching import plain_enough

    if plain_enough(config):
        batches = _fetched(config, ranges, stall_timeout_s, clock)
    else:
        batches = (
            batch for offsets in ranges for batch in read_range(config, offsets, stall_timeout_s, clock)
        )
    for batch in batches:
        records += batch.num_rows
        with clock.stage("handed over"):  # Spark takes the batch: to the JVM's Arrow reader
            yield batch
    clock.report(batch=batch_id(), records=records)


# As the consumers below: each worker keeps a fetcher (its connections, where partitions lead) per
# client config, lent to one task at a time.
_idle_fetchers: dict[str, Fetcher] = {}


def _fetched(
    config: Mapping[str, Any], ranges: list[OffsetRange], stall_timeout_s: float, clock: StageClock
) -> Iterator[pa.RecordBatch]:
    from onceflow.spark.fetching import Fetcher

    key = json.dumps(sorted(config.items()), default=str)
    fetcher = _idle_fetchers.pop(key, None) or Fetcher(config)
    wanted = [(offsets.topic, offsets.partition, offsets.start, offsets.end) for offsets in ranges]
    try:
        fetching = fetcher.read(wanted, stall_timeout_s, clock)
        while True:
            try:
                topic, partition, taken = next(fetching)
            except StopIteration as finished:
                left: list[tuple[str, int, int, int]] = finished.value
                break
            with clock.stage("arrow"):
                batch = batch_of_columns(taken, topic, partition)
            yield batch
    except BaseException:
        fetcher.close()  # a failed fetcher is not lent again
        raise
    _idle_fetchers[key] = fetcher
    for topic, partition, start, end in left:  # batches of a message format before v2
        yield from read_range(config, OffsetRange(topic, partition, start, end), stall_timeout_s, clock)


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
        # A read task knows its range is there (below the LSO): a fetch the broker holds back waiting
        # for more data only delays the partition's end-of-partition event, and the next task's first
        # fetch on a reused consumer, by up to this long (librdkafka's default is 500 ms): its
        # prefetch past the last range waits in the broker, and a new partition's fetch goes out
        # only after it. Read tasks of 50 records on a reused consumer: 22 ms at 20, 2.2 ms at 1.
        "fetch.wait.max.ms": FETCH_WAIT_MS,
        # librdkafka prefetches up to 100,000 records per partition (queued.min.messages), far past
        # a task's range, and a partition whose queue went over that waits fetch.queue.backoff.ms
        # (1 s) before its next fetch: a reused consumer assigned that partition again started
        # its next range a second late. A batch's worth ahead, and a short backoff: one bench stream
        # job (spark_job.py), exactly-once 42.8k records/s against 28.0k (at-least-once 54.8k
        # against 27.6k).
        "queued.min.messages": ROWS_PER_ARROW_BATCH,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        **QUICK_START,
        **config,
        "group.id": config.get("group.id", f"onceflow-reader-{uuid.uuid4()}"),
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    }


# Spark reuses a Python worker for task after task (spark.python.worker.reuse): each worker keeps an
# idle consumer per client config, so a read task skips the connection and bootstrap of a new one.
# A worker runs one task at a time, so a plain dict needs no lock.
_idle_consumers: dict[str, Consumer] = {}


def checkout_consumer(config: Mapping[str, Any]) -> tuple[str, Consumer]:
    key = json.dumps(sorted(config.items()), default=str)
    consumer = _idle_consumers.pop(key, None)
    return key, consumer if consumer is not None else Consumer(reader_config(config))


def read_range(
    config: Mapping[str, Any],
    offsets: InputPartition,
    stall_timeout_s: float,
    clock: StageClock | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the committed records of `offsets` as Arrow batches.

    Markers and aborted data leave gaps, so the read ends when a record at or past `end` arrives or
    the consumer reaches the end of the partition (its LSO, which is at least `end`), never by count.
    """
    if not isinstance(offsets, OffsetRange):
        return  # Spark plans one empty partition when there is nothing to read
    with collector_paused():
        yield from _read_assigned(config, offsets, stall_timeout_s, clock or StageClock("read"))


def _read_assigned(
    config: Mapping[str, Any], offsets: OffsetRange, stall_timeout_s: float, clock: StageClock
) -> Iterator[pa.RecordBatch]:
    key, consumer = checkout_consumer(config)
    consumer.assign([TopicPartition(offsets.topic, offsets.partition, offsets.start)])
    pending: list[Message] = []
    position = offsets.start
    last_progress = time.monotonic()
    try:
        while True:
            # consume() returns early only once it has as many messages as asked for, else at its
            # timeout: ask for no more than the range can still hold, and wait briefly.
            wanted = min(ROWS_PER_ARROW_BATCH, max(offsets.end - position, 1))
            with clock.stage("fetch"):
                messages = consumer.consume(num_messages=wanted, timeout=CONSUME_WAIT_S)
            records, done = records_before(messages, offsets.end)
            if records:
                pending += records
                position = records[-1].offset() + 1  # type: ignore[operator]
                done = done or position >= offsets.end
            if messages:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout_s:
                raise TimeoutError(
                    f"no progress reading {offsets.topic}-{offsets.partition} "
                    f"[{offsets.start}, {offsets.end}) for {stall_timeout_s:.0f} s"
                )
            if len(pending) >= ROWS_PER_ARROW_BATCH or (done and pending):
                with clock.stage("arrow"):
                    batch = to_arrow(pending, offsets.topic, offsets.partition)
                pending = []
                yield batch
            if done:
                break
    except BaseException:
        consumer.close()  # a failed consumer is not lent again
        raise
    # Unassigning drops what was fetched past `end`, so the next task starts from a clean queue.
    consumer.unassign()
    _idle_consumers[key] = consumer


def records_before(messages: list[Message], end: int) -> tuple[list[Message], bool]:
    """The records in `messages` (one partition's, in offset order) before offset `end`, and
    whether the range is done: a record at or past `end` came, or the end of the partition at
    or past `end`. An end of the partition before `end` is a broker behind the one that planned
    the range (a new leader whose high watermark lags): the rest comes later. A few calls per
    batch in C, not a Python loop per record, unless an event is among them."""
    records, reached = messages, False
    # By truth value: a KafkaError compared with None raises (confluent-kafka 2.x).
    if any(message.error() for message in messages):
        records = []
        for message in messages:
            error = message.error()
            if not error:
                records.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                reached = reached or message.offset() >= end  # type: ignore[operator]
            elif error.code() != KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise KafkaException(error)
            # A reader has a group only because librdkafka insists, and never uses it: a user
            # with no ACL on that random group reads all the same.
    within = bisect.bisect_left(records, end, key=_offset)
    return records[:within], within < len(records) or reached


_offset = operator.methodcaller("offset")


def to_arrow(messages: list[Message], topic: str, partition: int) -> pa.RecordBatch:
    """The records (one partition's, in offset order) as one Arrow batch, built a column at a time.

    A column that is the same for the whole batch, or that a few numbers describe (the topic, the
    partition, contiguous offsets, one timestamp type, no headers), is built by Arrow in C rather
    than from a Python object per record: 0.58 us a record against 0.75, 10,000 records a batch.
    """
    count = len(messages)
    kinds, millis = zip(*[message.timestamp() for message in messages], strict=True)
    headers = [message.headers() for message in messages]
    columns = [
        pa.array([message.key() for message in messages], pa.binary()),
        pa.array([message.value() for message in messages], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        _offsets(messages),
        *_timestamps(kinds, millis),
        _headers(headers),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _offsets(messages: list[Message]) -> pa.Array:
    first, last = messages[0].offset(), messages[-1].offset()
    assert first is not None and last is not None
    if last - first == len(messages) - 1:  # increasing, so no gap: first, first + 1, ..., last
        return pa.array(numpy.arange(first, last + 1, dtype=numpy.int64))
    return pa.array([message.offset() for message in messages], pa.int64())


def _timestamps(kinds: tuple[int, ...], millis: tuple[int, ...]) -> tuple[pa.Array, pa.Array]:
    """The timestamp and timestampType columns. confluent-kafka's kinds: 0 none, 1 create time,
    2 log append time; Spark's Kafka source says -1, 0 and 1."""
    kind = kinds[0]
    if kinds.count(kind) == len(kinds):
        stamps = pa.array(millis, MILLIS).cast(MICROS) if kind else pa.nulls(len(kinds), MICROS)
        return stamps, pa.repeat(pa.scalar(kind - 1 if kind else -1, pa.int32()), len(kinds))
    return (
        pa.array([ms * 1000 if each else None for each, ms in zip(kinds, millis, strict=True)], MICROS),
        pa.array([each - 1 if each else -1 for each in kinds], pa.int32()),
    )


def _headers(headers: list[Any]) -> pa.Array:
    """The headers column from what Message.headers() gave: None, or a list of (key, value)."""
    if headers.count(None) == len(headers):  # no record has headers: every list is empty
        offsets = pa.repeat(pa.scalar(0, pa.int32()), len(headers) + 1)
        return pa.ListArray.from_arrays(offsets, NO_HEADER_FIELDS)
    return pa.array(
        [[{"key": key, "value": value} for key, value in pairs] if pairs else () for pairs in headers],
        HEADERS,
    )


def stall_timeout(options: Mapping[str, str]) -> float:
    return float(options.get("readStallTimeoutMs", "120000")) / 1000


class OnceflowBatchReader(DataSourceReader):
    """`spark.read.format("onceflow")`: startingOffsets (default earliest) to endingOffsets (latest)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options  # Spark's case-insensitive mapping: keep it, keys and all
        planner = OffsetPlanner(options)
        try:
            bounds = planner.bounds()
            start = planner.resolve(options.get("startingOffsets", "earliest"), "startingOffsets", bounds)
            end = planner.resolve(options.get("endingOffsets", "latest"), "endingOffsets", bounds)
        finally:
            planner.close()
        self.tasks = read_tasks(offset_ranges(start, end), positive_int(options, "maxPartitions"))

    def partitions(self) -> list[InputPartition]:
        return self.tasks

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_task(client_config(self.options), partition, stall_timeout(self.options))


class OnceflowStreamReader(DataSourceStreamReader):
    """`spark.readStream.format("onceflow")`: each micro-batch ends at the partitions' LSOs."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options  # Spark's case-insensitive mapping: keep it, keys and all
        self.planner = OffsetPlanner(options)
        self.max_rows = positive_int(options, "maxOffsetsPerTrigger")
        self.max_tasks = positive_int(options, "maxPartitions")
        self.last_latest: Offsets | None = None

    def initialOffset(self) -> Offsets:
        return self.planner.resolve(self.options.get("startingOffsets", "latest"), "startingOffsets")

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows is not None else ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        # Spark asks reportLatestOffset right after this, in the same trigger: one request serves both.
        self.last_latest = self.planner.latest()
        latest = {topic: dict(partitions) for topic, partitions in self.last_latest.items()}
        # Offsets never move back: a partition that vanished keeps its last offset, and one whose
        # new leader reports a lower last stable offset for a while (its high watermark lags)
        # waits for it, or the records in between would be read twice.
        for topic, partitions in start.items():
            known = latest.setdefault(topic, {})
            for partition, offset in partitions.items():
                known[partition] = max(known.get(partition, offset), offset)
        latest = sorted_offsets(latest)
        if isinstance(limit, ReadMaxRows):
            return limit_offsets(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> Offsets:
        return self.last_latest if self.last_latest is not None else self.planner.latest()

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        return read_tasks(offset_ranges(start, end), self.max_tasks)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_task(client_config(self.options), partition, stall_timeout(self.options))

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        self.planner.close()
