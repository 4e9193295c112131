"""The sink's producing side: its settings, the exactly-once write slots and rows from Arrow.

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

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.spark.options import QUICK_START, OptionError, client_config
from onceflow.spark.task_times import StageClock, timed

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
DEFAULT_PROGRESS_TOPIC = "onceflow-progress"
# Spark's default number of shuffle partitions, so a query with a shuffle before the sink fits.
DEFAULT_PROGRESS_PARTITIONS = 200
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
CLIENT_TIMEOUT_S = 60.0
# How long a failed task's slot may take to abort its transaction.
ABORT_TIMEOUT_S = 10.0
WRITABLE_COLUMNS = {"key", "value", "topic", "partition", "headers"}
# A write task only needs to hear of failed deliveries, so its producers report nothing else and
# are polled only when their queue is full. A Python callback and a poll per record, with keyword
# arguments, took 5-7 us a record, positional arguments and a producer-wide callback 1-4 us
# (200,000 records of 100 B to a local broker).
PRODUCER_DEFAULTS = {**QUICK_START, "delivery.report.only.error": True}
ANY_PARTITION = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner picks


class TransactionTooSlow(RuntimeError):
    """A write task outlived its transaction: the coordinator would abort it under us."""


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
    """The producer of one write-task slot, kept by the executor's slot keeper between tasks."""

    def __init__(self, settings: SinkSettings, prefix: str, partition: int) -> None:
        self.settings = settings
        self.partition = partition
        self.progress = Consumer(
            {
                **QUICK_START,
                **settings.config,
                "group.id": prefix,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        try:
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
            self._init_transactions()
            # Read once, right after fencing every earlier producer of the slot; from then on the
            # slot counts what it commits itself. The count is exact for as long as no other
            # producer fences this one, and a fenced producer fails at its next transaction.
            progress = TopicPartition(settings.progress_topic, partition)
            self.batches_done: int = max(
                self.progress.committed([progress], timeout=CLIENT_TIMEOUT_S)[0].offset, 0
            )
        except BaseException:
            self.progress.close()
            raise

    def _init_transactions(self) -> None:
        try:
            self.producer.init_transactions(CLIENT_TIMEOUT_S)
        except KafkaException as error:
            if error.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                raise OptionError(
                    f"the broker refuses transaction.timeout.ms={self.settings.transaction_timeout_ms}: "
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

    def write(
        self, batch_id: int, batches: Iterable[pa.RecordBatch], before_commit: Callable[[int], None]
    ) -> int:
        """Write batch `batch_id` in one transaction with its progress; `before_commit` is given
        the number of records once they are all in the broker and may stop the commit by raising."""
        clock = StageClock("keeper write")
        self.producer.begin_transaction()
        began = time.monotonic()
        count = produce_batches(
            self.producer,
            timed(batches, clock, "rows from the task"),
            self.settings.topic,
            lambda: self._check_time(batch_id, began),
            clock,
        )
        flushing = time.perf_counter()
        try:
            self.producer.flush(CLIENT_TIMEOUT_S)
        except SystemError as error:
            # confluent-kafka 2.16 turns a fatal error met while it calls the delivery callback (such
            # as being fenced) into a SystemError, caused by the KafkaException that says what it is
            # or, now and then, by nothing at all.
            if isinstance(error.__cause__, KafkaException):
                raise error.__cause__ from None
            raise KafkaException(self.delivery.first or KafkaError(KafkaError._FATAL, str(error))) from error
        self.delivery.raise_first()
        clock.add("flush", time.perf_counter() - flushing)
        self._check_time(batch_id, began)
        with clock.stage("task's go-ahead"):
            before_commit(count)
        with clock.stage("commit"):
            offset = TopicPartition(self.settings.progress_topic, self.partition, batch_id + 1)
            self.producer.send_offsets_to_transaction(
                [offset], self.progress.consumer_group_metadata(), CLIENT_TIMEOUT_S
            )
            self.producer.commit_transaction(CLIENT_TIMEOUT_S)
        self.batches_done = batch_id + 1
        clock.report(batch=batch_id, records=count)
        return count

    def _check_time(self, batch_id: int, began: float) -> None:
        elapsed_ms = (time.monotonic() - began) * 1000
        # Leave a margin for the commit itself; past the timeout the coordinator aborts the work.
        if elapsed_ms > 0.8 * self.settings.transaction_timeout_ms:
            raise TransactionTooSlow(
                f"batch {batch_id}, write task {self.partition}: {elapsed_ms:.0f} ms of writing does not fit "
                f"in kafka.transaction.timeout.ms={self.settings.transaction_timeout_ms}; raise it (up to "
                "the broker's transaction.max.timeout.ms) or lower maxOffsetsPerTrigger"
            )

    def abandon(self) -> None:
        """Close the slot of a task that failed, aborting its open transaction, if any, so that
        read_committed readers of its topics need not wait for the next attempt to fence it."""
        with contextlib.suppress(KafkaException):  # none open, or this producer was fenced
            self.producer.abort_transaction(ABORT_TIMEOUT_S)
        self.close()

    def close(self) -> None:
        self.producer.flush(1.0)
        self.progress.close()


def held_slot(
    settings: SinkSettings, prefix: str, partition: int, batch_id: int, kept: TransactionalSlot | None
) -> TransactionalSlot:
    """The slot `kept` from an earlier task, unless it was built with other settings or its count
    of batches landed falls short of `batch_id` (other producers landed the batches between); else a
    new slot, which fences every other."""
    if kept is not None:
        if kept.settings == settings and kept.batches_done >= batch_id:
            return kept
        kept.close()
    return TransactionalSlot(settings, prefix, partition)


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
    clock: StageClock | None = None,
) -> int:
    """Produce the rows of Spark's Arrow batches, read column by column; how many there were.
    `clock` gets the time spent producing them."""
    clock = clock or StageClock("produce")
    count = 0
    for batch in batches:
        producing = time.perf_counter()
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
        clock.add("produce", time.perf_counter() - producing)
        after_each()
    return count
