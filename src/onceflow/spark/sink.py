"""The onceflow sink: rows to Kafka topics, exactly once per write task, taken as Arrow batches.

An exactly-once write task streams its rows to its executor's slot keeper, which keeps the
transactional producers (`onceflow.spark.slot_keeper`); the protocol is in
`onceflow.spark.producing`. At-least-once tasks produce from their own Python worker.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from onceflow import failpoints
from onceflow.spark.collector import freeze_between_tasks
from onceflow.spark.producing import (
    AT_LEAST_ONCE,
    CLIENT_TIMEOUT_S,
    PRODUCER_DEFAULTS,
    DeliveryErrors,
    SinkSettings,
    produce_batches,
)
from onceflow.spark.slot_keeper import write_through_keeper
from onceflow.spark.task_input import whole_input
from onceflow.spark.task_times import StageClock, batch_id, timed


@dataclass
class TaskReport(WriterCommitMessage):
    partition: int
    attempt: int
    records: int
    skipped: bool


def task_context() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the onceflow sink writes only inside Spark tasks")
    return context


def write_exactly_once(
    settings: SinkSettings, prefix: str, batch: int, batches: Iterator[pa.RecordBatch]
) -> TaskReport:
    context = task_context()
    partition = context.partitionId()
    # The parent of a Python worker forks all of its executor's workers (or is the executor).
    owner = os.getppid()
    clock = StageClock("write, exactly-once")
    # A task killed midway must not commit the rows it got so far.
    rows = timed(whole_input(batches), clock, "waiting for rows")
    count, skipped = write_through_keeper(owner, settings, prefix, partition, batch, rows, clock)
    clock.report(batch=batch, records=count, skipped=skipped)
    return TaskReport(partition, context.attemptNumber(), count, skipped)


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
    clock = StageClock("write, at-least-once")
    try:
        rows = timed(batches, clock, "waiting for rows")
        count = produce_batches(producer, rows, settings.topic, lambda: None, clock)
        with clock.stage("flush"):
            remaining = producer.flush(CLIENT_TIMEOUT_S)
        delivery.raise_first()
        if remaining:
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, f"{remaining} records not delivered"))
    except BaseException:
        producer.purge()  # the retried task writes these rows again
        raise
    _idle_producers[key] = (producer, delivery)
    clock.report(batch=batch_id(), records=count)
    return TaskReport(context.partitionId(), context.attemptNumber(), count, False)


class OnceflowStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("onceflow")`."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = SinkSettings.from_options(options, schema)
        self.settings.prepare()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        freeze_between_tasks()
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
        freeze_between_tasks()  # a driver-side Python worker, collected after each call
        # The worst moment for the driver to die: all output written, the batch not yet in
        # the checkpoint's commit log, so a restart runs it again.
        failpoints.reach("spark.sink.commit", whole_session=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: committed tasks are skipped when the batch runs again."""


class OnceflowBatchWriter(DataSourceArrowWriter):
    """`df.write.format("onceflow")`: one write, exactly once per task under task retries."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = SinkSettings.from_options(options, schema)
        # A fresh prefix per write, after the user's if given: its tasks' retries find each
        # other's progress, nothing else does (every write is batch 0, so a later write under
        # the same prefix would find the first one's and skip its rows).
        self.prefix = f"{self.settings.transactional_id_prefix or 'onceflow'}-write-{uuid.uuid4()}"
        self.settings.prepare()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        freeze_between_tasks()
        if self.settings.guarantee == AT_LEAST_ONCE:
            return write_at_least_once(self.settings, iterator)
        return write_exactly_once(self.settings, self.prefix, 0, iterator)
