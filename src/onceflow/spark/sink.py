"""The onceflow sink: rows to Kafka topics, exactly once per write task, taken as Arrow batches.

The protocol, and why it holds: docs/design.md#the-spark-sinks-fencing-protocol.

Each write task p of batch B owns the transactional id `P-p`:
  1. `init_transactions()` fences every earlier attempt of the slot and ends its open transaction;
  2. the committed offset of group P on (progress topic, p) is read; it is stable after step 1;
  3. if it is at least B+1 the batch already landed and the task writes nothing; otherwise it
     produces the rows and commits them together with offset B+1, in one transaction.
Retries, speculative attempts and a restarted driver replaying B all hit step 3. Output becomes
visible per task, not per micro-batch, and a replayed batch must send the same rows to the same
task (a deterministic plan), as Spark's replay from the checkpoint does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from onceflow import failpoints
from onceflow.spark.options import QUICK_START, OptionError, client_config

EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
DEFAULT_PROGRESS_TOPIC = "onceflow-progress"
# Spark's default number of shuffle partitions, so a query with a shuffle before the sink fits.
DEFAULT_PROGRESS_PARTITIONS = 200
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
CLIENT_TIMEOUT_S = 60.0
# How long a slot kept from an earlier task waits to read its progress before fencing anew. A
# committed offset reads in milliseconds (3.7 ms p50, 25 ms at most, in a loaded bench query), but
# offsets staged by an attempt that failed before committing keep the partition unstable until its
# transaction times out (a minute by default); a new slot's init_transactions aborts it at once.
KEPT_SLOT_CHECK_TIMEOUT_S = 2.0
WRITABLE_COLUMNS = {"key", "value", "topic", "partition", "headers"}
# A write task only needs to hear of failed deliveries, so its producers report nothing else and
# are polled only when their queue is full. A Python callback and a poll per record, with keyword
# arguments, took 5-7 us a record, positional arguments and a producer-wide callback 1-4 us
# (200,000 records of 100 B to a local broker).
PRODUCER_DEFAULTS = {**QUICK_START, "delivery.report.only.error": True}
ANY_PARTITION = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner picks


class TransactionTooSlow(RuntimeError):
    """A write task outlived its transaction: the coordinator would abort it under us."""


@dataclass
class TaskReport(WriterCommitMessage):
    partition: int
    attempt: int
    records: int
    skipped: bool


@dataclass(frozen=True)
class SinkSettings:
    """Everything a write task needs, picklable and decided on the driver."""

    config: dict[str, Any]
    topic: str | None
    guarantee: str
    transactional_id_prefix: str | None
    progress_topic: str
    progress_partitions: int
    transaction_timeout_ms: int

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: StructType) -> SinkSettings:
        config = client_config(options)
        columns = set(schema.fieldNames())
        if "value" not in columns:
            raise OptionError("the onceflow sink needs a 'value' column")
        unknown = columns - WRITABLE_COLUMNS
        if unknown:
            raise OptionError(
                f"the onceflow sink writes only {sorted(WRITABLE_COLUMNS)}; drop {sorted(unknown)}"
            )
        topic = options.get("topic")
        if topic is None and "topic" not in columns:
            raise OptionError("give the option 'topic' or a 'topic' column")
        guarantee = options.get("deliveryGuarantee", EXACTLY_ONCE)
        if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
            raise OptionError(
                f"deliveryGuarantee must be {EXACTLY_ONCE} or {AT_LEAST_ONCE}, not {guarantee!r}"
            )
        timeout_ms = int(config.pop("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))
        return cls(
            config=config,
            topic=topic,
            guarantee=guarantee,
            transactional_id_prefix=options.get("transactionalIdPrefix"),
            progress_topic=options.get("progressTopic", DEFAULT_PROGRESS_TOPIC),
            progress_partitions=int(options.get("progressTopicPartitions", DEFAULT_PROGRESS_PARTITIONS)),
            transaction_timeout_ms=timeout_ms,
        )

    def prepare(self) -> None:
        """On the driver, before any task runs: create the progress topic that exactly-once needs."""
        if self.guarantee != EXACTLY_ONCE:
            return
        admin = AdminClient(self.config)
        topic = NewTopic(self.progress_topic, self.progress_partitions, -1)
        future = admin.create_topics([topic])[self.progress_topic]
        try:
            future.result(timeout=CLIENT_TIMEOUT_S)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise OptionError(f"cannot create progress topic {self.progress_topic!r}: {error}") from error


class TransactionalSlot:
    """The producer of one write-task slot, kept for the life of a Python worker."""

    def __init__(self, settings: SinkSettings, prefix: str, partition: int) -> None:
        self.settings = settings
        self.partition = partition
        self.progress_offset = TopicPartition(settings.progress_topic, partition)
        # The progress this producer itself last saw or made; any other value means another
        # worker's producer has taken the slot over since, fencing this one.
        self.batches_done_here: int | None = None
        self.progress = progress_reader(settings, prefix)
        self._check_progress_partition()
        # A slot whose task failed is never used again, so its first failure is all it needs.
        self.delivery = DeliveryErrors()
        self.producer = Producer(
            {
                **PRODUCER_DEFAULTS,
                **settings.config,
                "on_delivery": self.delivery,
                "transactional.id": f"{prefix}-{partition}",
                "transaction.timeout.ms": settings.transaction_timeout_ms,
                "enable.idempotence": True,
                "acks": "all",
            }
        )
        try:
            self.producer.init_transactions(CLIENT_TIMEOUT_S)
        except KafkaException as error:
            if error.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                raise OptionError(
                    f"the broker refuses transaction.timeout.ms={settings.transaction_timeout_ms}: "
                    "it is above the broker's transaction.max.timeout.ms"
                ) from error
            raise

    def _check_progress_partition(self) -> None:
        topic = self.progress.list_topics(self.settings.progress_topic, timeout=CLIENT_TIMEOUT_S).topics[
            self.settings.progress_topic
        ]
        if topic.error is not None or self.partition >= len(topic.partitions):
            raise OptionError(
                f"write task {self.partition} has no partition in progress topic "
                f"{self.settings.progress_topic!r} ({len(topic.partitions)} partitions): "
                "write with fewer tasks or use a progressTopic with more partitions"
            )

    def batches_done(self, timeout_s: float = CLIENT_TIMEOUT_S) -> int:
        """How many batches of this slot have landed: the committed progress offset."""
        committed = self.progress.committed([self.progress_offset], timeout=timeout_s)[0]
        return max(committed.offset, 0)

    def batches_done_if_still_held(self) -> int | None:
        """For a slot kept from an earlier task: the batches landed if this producer still holds
        the slot, None if another took it over since, or if the progress stays unstable (another
        attempt's offsets staged in a transaction left open: only fencing ends it quickly)."""
        try:
            batches_done = self.batches_done(KEPT_SLOT_CHECK_TIMEOUT_S)
        except KafkaException as error:
            if error.args[0].code() != KafkaError._TIMED_OUT:
                raise
            return None
        return batches_done if batches_done == self.batches_done_here else None

    def write(self, batch_id: int, batches_done: int, batches: Iterable[pa.RecordBatch]) -> tuple[int, bool]:
        """Write batch `batch_id` unless `batches_done` (read after fencing) says it landed."""
        if batches_done > batch_id:
            self.batches_done_here = batches_done
            return 0, True
        self.producer.begin_transaction()
        began = time.monotonic()
        count = produce_batches(
            self.producer, batches, self.settings.topic, lambda: self._check_time(batch_id, began)
        )
        self.producer.flush(CLIENT_TIMEOUT_S)
        self.delivery.raise_first()
        self._check_time(batch_id, began)
        # The moment to lose the executor: the rows are in the broker, in a transaction left open.
        failpoints.hold("spark.sink.before-transaction-commit")
        offset = TopicPartition(self.settings.progress_topic, self.partition, batch_id + 1)
        self.producer.send_offsets_to_transaction(
            [offset], self.progress.consumer_group_metadata(), CLIENT_TIMEOUT_S
        )
        self.producer.commit_transaction(CLIENT_TIMEOUT_S)
        self.batches_done_here = batch_id + 1
        return count, False

    def _check_time(self, batch_id: int, began: float) -> None:
        elapsed_ms = (time.monotonic() - began) * 1000
        # Leave a margin for the commit itself; past the timeout the coordinator aborts the work.
        if elapsed_ms > 0.8 * self.settings.transaction_timeout_ms:
            raise TransactionTooSlow(
                f"batch {batch_id}, write task {self.partition}: {elapsed_ms:.0f} ms of writing does not fit "
                f"in kafka.transaction.timeout.ms={self.settings.transaction_timeout_ms}; raise it (up to "
                "the broker's transaction.max.timeout.ms) or lower maxOffsetsPerTrigger"
            )

    def close(self) -> None:
        self.producer.flush(1.0)


# Python workers are reused across tasks: keep one slot per transactional id per worker.
_slots: dict[str, TransactionalSlot] = {}
# And one progress reader per query (its prefix) and client config: the group's committed offsets
# are the same for every slot, and a reader is never fenced.
_progress_readers: dict[str, Consumer] = {}


def progress_reader(settings: SinkSettings, prefix: str) -> Consumer:
    key = json.dumps([prefix, sorted(settings.config.items())], default=str)
    reader = _progress_readers.get(key)
    if reader is None:
        reader = Consumer(
            {
                **QUICK_START,
                **settings.config,
                "group.id": prefix,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        _progress_readers[key] = reader
    return reader


def task_context() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the onceflow sink writes only inside Spark tasks")
    return context


def write_exactly_once(
    settings: SinkSettings, prefix: str, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> TaskReport:
    context = task_context()
    partition = context.partitionId()
    key = f"{prefix}-{partition}"
    slot: TransactionalSlot | None = None
    try:
        slot, batches_done = held_slot(settings, prefix, partition, _slots.pop(key, None))
        count, skipped = slot.write(batch_id, batches_done, batches)
    except BaseException:
        # A fenced, failed or half-done slot is never reused: the next attempt fences it anew.
        if slot is not None:
            slot.close()
        raise
    _slots[key] = slot
    return TaskReport(partition, context.attemptNumber(), count, skipped)


def held_slot(
    settings: SinkSettings, prefix: str, partition: int, kept: TransactionalSlot | None
) -> tuple[TransactionalSlot, int]:
    """The slot `kept` from an earlier task if it still holds the transactional id, else a new one
    (which fences every other), with the batches landed."""
    if kept is not None:
        try:
            batches_done = kept.batches_done_if_still_held()
        except BaseException:
            kept.close()
            raise
        if batches_done is not None:
            return kept, batches_done
        kept.close()
    slot = TransactionalSlot(settings, prefix, partition)
    try:
        return slot, slot.batches_done()
    except BaseException:
        slot.close()
        raise


# An idempotent producer per client config and Python worker, lent to one task at a time. It is
# flushed empty at the end of every task that succeeds; one whose task failed is not lent again.
_idle_producers: dict[str, tuple[Producer, DeliveryErrors]] = {}


def write_at_least_once(settings: SinkSettings, batches: Iterator[pa.RecordBatch]) -> TaskReport:
    context = task_context()
    key = json.dumps(sorted(settings.config.items()), default=str)
    idle = _idle_producers.pop(key, None)
    if idle is None:
        delivery = DeliveryErrors()
        producer = Producer(
            {
                **PRODUCER_DEFAULTS,
                **settings.config,
                "on_delivery": delivery,
                "enable.idempotence": True,
                "acks": "all",
            }
        )
    else:
        producer, delivery = idle
    try:
        count = produce_batches(producer, batches, settings.topic, lambda: None)
        remaining = producer.flush(CLIENT_TIMEOUT_S)
        delivery.raise_first()
        if remaining:
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, f"{remaining} records not delivered"))
    except BaseException:
        producer.purge()  # the retried task writes these rows again
        raise
    _idle_producers[key] = (producer, delivery)
    return TaskReport(context.partitionId(), context.attemptNumber(), count, False)


class DeliveryErrors:
    """Collects failed deliveries from a producer's callback; the task fails on the first one."""

    def __init__(self) -> None:
        self.first: KafkaError | None = None

    def __call__(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None and self.first is None:
            self.first = error

    def raise_first(self) -> None:
        if self.first is not None:
            raise KafkaException(self.first)


def produce_batches(
    producer: Producer,
    batches: Iterable[pa.RecordBatch],
    default_topic: str | None,
    after_each: Callable[[], None],
) -> int:
    """Produce the rows of Spark's Arrow batches, read column by column; how many there were."""
    count = 0
    for batch in batches:
        columns = dict(zip(batch.schema.names, (column.to_pylist() for column in batch.columns), strict=True))
        values = columns["value"]
        absent = [None] * len(values)
        rows = zip(
            columns.get("topic", absent),
            values,
            columns.get("key", absent),
            columns.get("partition", absent),
            columns.get("headers", absent),
            strict=True,
        )
        for topic, value, key, partition, headers in rows:
            chosen = topic or default_topic
            assert chosen is not None, "checked on the driver: a topic option or column"
            target = ANY_PARTITION if partition is None else partition
            pairs = [(header["key"], header["value"]) for header in headers] if headers else None
            while True:
                try:
                    if pairs is None:
                        producer.produce(chosen, value, key, target)
                    else:
                        producer.produce(chosen, value, key, target, headers=pairs)
                    break
                except BufferError:
                    producer.poll(0.05)  # the local queue is full: let deliveries drain it
        count += len(values)
        after_each()
    return count


class OnceflowStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("onceflow")`."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = SinkSettings.from_options(options, schema)
        self.settings.prepare()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        if self.settings.guarantee == AT_LEAST_ONCE:
            return write_at_least_once(self.settings, iterator)
        context = task_context()
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or "")
        # The query id is kept in the checkpoint, so a restarted query finds its own progress.
        query_id = context.getLocalProperty("sql.streaming.queryId")
        prefix = self.settings.transactional_id_prefix or f"onceflow-{query_id}"
        return write_exactly_once(self.settings, prefix, batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing left to do: each task committed its own transaction. Safe to call twice."""
        # The worst moment for the driver to die: all output written, the batch not yet in
        # the checkpoint's commit log, so a restart runs it again.
        failpoints.reach("spark.sink.commit", whole_session=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: committed tasks are skipped when the batch runs again."""


class OnceflowBatchWriter(DataSourceArrowWriter):
    """`df.write.format("onceflow")`: one write, exactly once per task under task retries."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = SinkSettings.from_options(options, schema)
        # A fresh prefix per write: its tasks' retries find each other's progress, nothing else does.
        self.prefix = self.settings.transactional_id_prefix or f"onceflow-write-{uuid.uuid4()}"
        self.settings.prepare()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        if self.settings.guarantee == AT_LEAST_ONCE:
            return write_at_least_once(self.settings, iterator)
        return write_exactly_once(self.settings, self.prefix, 0, iterator)
