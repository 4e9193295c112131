"""The data source's Python side, without a JVM: the driver's requests per trigger, the workers' clients."""

from __future__ import annotations

import dataclasses
import gc
import socket
import struct
import time
import types
import weakref
from typing import BinaryIO

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable

from onceflow import EmbeddedBroker
from onceflow.spark import collector, source
from onceflow.spark.producing import EXACTLY_ONCE, SinkSettings, held_slot, produce_batches
from onceflow.spark.source import (
    ARROW_SCHEMA,
    OffsetRange,
    OnceflowStreamReader,
    ReadTask,
    read_range,
    read_task,
    read_tasks,
    records_before,
    to_arrow,
)
from onceflow.spark.task_input import InputCutOff, whole_input
from tests.broker.test_metrics import scrape, value
from tests.spark.helpers import produce_transactions
from tests.spark.test_data_source import create
from tests.support import read_to_end, values

LIST_OFFSETS = {"request": "ListOffsets", "api_key": "2"}
REQUESTS = "kafka_network_requestmetrics_requests_total"


def test_a_trigger_asks_for_all_partitions_offsets_in_one_request(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 6))
    produce_transactions(bootstrap, "in", [f"v{n}" for n in range(60)], 20, 0, "feed")
    hanging = Producer({"bootstrap.servers": bootstrap, "transactional.id": "open"})
    hanging.init_transactions(30)
    hanging.begin_transaction()
    hanging.produce("in", value=b"uncommitted", partition=0)
    hanging.flush(30)
    reader = OnceflowStreamReader({"kafka.bootstrap.servers": bootstrap, "subscribe": "in"})
    try:
        start = reader.initialOffset()
        before = value(scrape(broker.metrics_url), REQUESTS, **LIST_OFFSETS)
        latest = reader.latestOffset(start, ReadAllAvailable())
        assert reader.reportLatestOffset() == latest
        after = value(scrape(broker.metrics_url), REQUESTS, **LIST_OFFSETS)
        high_marks = {p: high_mark(bootstrap, p) for p in range(6)}
    finally:
        reader.stop()
        hanging.abort_transaction(30)
    assert after - before == 1
    # read_committed: partition 0 ends at its open transaction's record, one below its high mark.
    assert latest == {"in": {str(p): high_marks[p] - (p == 0) for p in range(6)}}


def high_mark(bootstrap: str, partition: int) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "marks", "isolation.level": "read_uncommitted"}
    )
    try:
        return int(consumer.get_watermark_offsets(TopicPartition("in", partition), timeout=30)[1])
    finally:
        consumer.close()


def test_a_python_worker_reads_range_after_range_with_one_consumer(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 1))
    produce_transactions(bootstrap, "in", [f"v{n}" for n in range(30)], 30, 0, "feed")
    config = {"bootstrap.servers": bootstrap}

    def read(start: int, end: int) -> list[bytes]:
        batches = read_range(config, OffsetRange("in", 0, start, end), stall_timeout_s=30)
        return [value for batch in batches for value in batch.column("value").to_pylist()]

    assert read(0, 5) == [f"v{n}".encode() for n in range(5)]
    [(key, consumer)] = source._idle_consumers.items()
    try:
        # The first read fetched past 5; none of that may leak into a read that starts elsewhere.
        assert read(12, 15) == [b"v12", b"v13", b"v14"]
        assert read(2, 4) == [b"v2", b"v3"]
        assert source._idle_consumers == {key: consumer}
    finally:
        source._idle_consumers.pop(key).close()


def test_a_read_task_gives_every_column_of_a_record(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 2))
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("in", b"plain", partition=1, timestamp=1_000)
    producer.produce("in", b"v", b"k", partition=1, timestamp=1_234, headers=[("a", b"1"), ("b", None)])
    assert producer.flush(30) == 0
    batches = list(read_range({"bootstrap.servers": bootstrap}, OffsetRange("in", 1, 0, 2), 30))
    try:
        rows = [row for batch in batches for row in batch.to_pylist()]
        for row in rows:
            row["timestamp"] = row["timestamp"].timestamp()
        assert rows == [
            {
                "key": None,
                "value": b"plain",
                "topic": "in",
                "partition": 1,
                "offset": 0,
                "timestamp": 1.0,
                "timestampType": 0,
                "headers": [],
            },
            {
                "key": b"k",
                "value": b"v",
                "topic": "in",
                "partition": 1,
                "offset": 1,
                "timestamp": 1.234,
                "timestampType": 0,
                "headers": [{"key": "a", "value": b"1"}, {"key": "b", "value": None}],
            },
        ]
    finally:
        for consumer in source._idle_consumers.values():
            consumer.close()
        source._idle_consumers.clear()


HEADER_LISTS = st.none() | st.lists(
    st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=3)), max_size=2
)


@st.composite
def consumed_batches(draw: st.DrawFn) -> list[Message]:
    """One partition's records as a consumer hands them over: offsets increasing, with or without
    gaps (markers, aborted data); one timestamp type or several; headers on none, some or all."""
    count = draw(st.integers(1, 20))
    gaps = draw(st.lists(st.integers(1, 3), min_size=count, max_size=count) | st.just([1] * count))
    kinds = draw(
        st.lists(st.sampled_from([0, 1, 2]), min_size=count, max_size=count) | st.sampled_from([0, 1, 2])
    )
    headers = draw(st.lists(HEADER_LISTS, min_size=count, max_size=count) | st.just([None] * count))
    offset = draw(st.integers(0, 2**40))
    messages = []
    for n in range(count):
        offset += gaps[n]
        kind = kinds[n] if isinstance(kinds, list) else kinds
        messages.append(
            Message(
                topic="t",
                partition=3,
                offset=offset,
                key=draw(st.none() | st.binary(max_size=4)),
                value=draw(st.none() | st.binary(max_size=4)),
                timestamp=(kind, draw(st.integers(-1, 2**41)) if kind else 0),
                headers=headers[n],
            )
        )
    return messages


@given(consumed_batches())
def test_a_batch_of_records_becomes_the_same_arrow_batch_as_record_by_record(messages: list[Message]) -> None:
    expected = pa.RecordBatch.from_pylist(
        [
            {
                "key": message.key(),
                "value": message.value(),
                "topic": "t",
                "partition": 3,
                "offset": message.offset(),
                "timestamp": message.timestamp()[1] * 1000 if message.timestamp()[0] else None,
                "timestampType": message.timestamp()[0] - 1 if message.timestamp()[0] else -1,
                "headers": [{"key": key, "value": value} for key, value in message.headers() or []],
            }
            for message in messages
        ],
        schema=ARROW_SCHEMA,
    )
    assert to_arrow(messages, "t", 3).equals(expected)


def test_a_read_task_pauses_the_garbage_collector_until_it_ends(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 1))
    produce_transactions(bootstrap, "in", [f"v{n}" for n in range(30)], 30, 0, "feed")
    batches = read_range({"bootstrap.servers": bootstrap}, OffsetRange("in", 0, 0, 30), 30)
    try:
        assert gc.isenabled()
        assert next(batches).num_rows == 30
        assert not gc.isenabled()
        assert list(batches) == []
        assert gc.isenabled()
    finally:
        gc.enable()
        for consumer in source._idle_consumers.values():
            consumer.close()
        source._idle_consumers.clear()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_task_freezes_what_the_worker_holds_and_collects_it_all_now_and_then() -> None:
    """What was alive when a task started is out of the daemon's collection after the task; a
    cycle that died frozen is collected at the next full collection, not never."""
    collector._tasks_since_full_collection = 0
    cycle = _Cycle()
    died = weakref.ref(cycle)
    try:
        collector.freeze_between_tasks()
        del cycle
        gc.collect()  # the daemon's collection after the task
        assert died() is not None, "a frozen cycle is out of reach"
        for _ in range(collector.FULL_COLLECTION_EVERY - 2):
            collector.freeze_between_tasks()
        gc.collect()
        assert died() is not None, "collected before its time: the freeze did not hold"
        collector.freeze_between_tasks()
        assert died() is None
    finally:
        gc.unfreeze()


def test_read_tasks_group_partitions_by_backlog_and_keep_the_plan_for_a_replay() -> None:
    ranges = [OffsetRange("in", p, 100, 100 + size) for p, size in enumerate([10, 50, 20, 20, 5])]
    assert read_tasks(ranges, None) == ranges
    assert read_tasks(ranges, 5) == ranges
    tasks = read_tasks(ranges, 2)
    assert tasks == read_tasks(list(ranges), 2)  # a replay plans the same tasks
    assert all(isinstance(task, ReadTask) for task in tasks)
    members = [[offsets.partition for offsets in task.ranges] for task in tasks]  # type: ignore[attr-defined]
    # Largest first, each to the lightest task: 50 | 20, 20 | 10 to the second (40 < 50) | 5 to
    # the first (50 = 50, the first wins); each task reads in partition order.
    assert members == [[1, 4], [0, 2, 3]]


def test_a_read_task_reads_its_partitions_in_turn(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 3))
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(30):
        producer.produce("in", f"v{n}".encode(), partition=n % 3)
    assert producer.flush(30) == 0
    task = ReadTask((OffsetRange("in", 2, 0, 10), OffsetRange("in", 0, 3, 10)))
    try:
        batches = list(read_task({"bootstrap.servers": bootstrap}, task, 30))
        rows = [(row["partition"], row["value"]) for batch in batches for row in batch.to_pylist()]
    finally:
        for consumer in source._idle_consumers.values():
            consumer.close()
        source._idle_consumers.clear()
    assert rows == [(2, f"v{n}".encode()) for n in range(2, 30, 3)] + [
        (0, f"v{n}".encode()) for n in range(9, 30, 3)
    ]


class FakeMessage:
    def __init__(self, offset: int, error: KafkaError | None = None) -> None:
        self._offset, self._error = offset, error

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError | None:
        return self._error


def test_a_consumed_batch_is_cut_at_the_range_end_and_at_the_partition_end() -> None:
    def cut(messages: list[FakeMessage], end: int) -> tuple[list[int], bool]:
        records, done = records_before(messages, end)  # type: ignore[arg-type]
        return [record.offset() for record in records], done

    # Gaps (markers, aborted records) do not count: the cut is by offset.
    assert cut([FakeMessage(n) for n in (5, 6, 8, 9)], 8) == ([5, 6], True)
    assert cut([FakeMessage(n) for n in (5, 6, 8, 9)], 7) == ([5, 6], True)
    assert cut([FakeMessage(n) for n in (5, 6, 8, 9)], 20) == ([5, 6, 8, 9], False)

    def end_of_partition(offset: int) -> FakeMessage:
        return FakeMessage(offset, KafkaError(KafkaError._PARTITION_EOF))

    assert cut([FakeMessage(8), FakeMessage(9), end_of_partition(10)], 10) == ([8, 9], True)
    assert cut([end_of_partition(20)], 20) == ([], True)
    # Short of the range's end (a new leader whose high watermark lags): not done, and what
    # comes after the event in the same call is kept.
    assert cut([FakeMessage(8), end_of_partition(9), FakeMessage(9)], 20) == ([8, 9], False)
    assert cut([], 20) == ([], False)
    with pytest.raises(KafkaException):
        cut([FakeMessage(8), FakeMessage(9, KafkaError(KafkaError._TRANSPORT))], 20)


def test_the_sink_produces_records_from_arrow_columns(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("t1", 4), ("default", 1))
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    full = pa.RecordBatch.from_arrays(
        [
            pa.array([b"a", None], pa.binary()),
            pa.array([b"1", b"2"], pa.binary()),
            pa.array(["t1", None], pa.string()),
            pa.array([3, None], pa.int32()),
            pa.array([[{"key": "h", "value": b"x"}], []], headers),
        ],
        names=["value", "key", "topic", "partition", "headers"],
    )
    only_values = pa.RecordBatch.from_arrays([pa.array([b"v"], pa.binary())], names=["value"])
    producer = Producer({"bootstrap.servers": bootstrap})
    batches_done: list[int] = []
    produced = produce_batches(producer, [full, only_values], "default", lambda: batches_done.append(1))
    assert (produced, producer.flush(30), batches_done) == (3, 0, [1, 1])
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check"})
    consumer.assign([TopicPartition("t1", 3, 0), TopicPartition("default", 0, 0)])
    try:
        received = []
        deadline = time.monotonic() + 30
        while len(received) < 3 and time.monotonic() < deadline:
            received.extend(message for message in consumer.consume(3, 1.0) if message.error() is None)
    finally:
        consumer.close()
    assert sorted(
        (
            (message.topic(), message.partition(), message.key(), message.value(), message.headers())
            for message in received
        ),
        key=repr,
    ) == [
        ("default", 0, None, b"v", None),
        ("default", 0, b"2", None, None),
        ("t1", 3, b"1", b"a", [("h", b"x")]),
    ]


def test_a_kept_slot_that_another_producer_fenced_fails_and_the_retry_lands_once(
    broker: EmbeddedBroker,
) -> None:
    """A kept slot trusts its own count of the batches landed, which holds while no other producer
    fences it. Fenced by an attempt that landed nothing (here one lost with its progress staged and
    its transaction open), it fails at its next transaction; the retry's new slot aborts the lost
    attempt and lands the batch once."""
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("out", 1))
    settings = SinkSettings(
        {"bootstrap.servers": bootstrap}, "out", EXACTLY_ONCE, None, "progress", 1, 60_000
    )
    settings.prepare()
    rows = pa.RecordBatch.from_arrays([pa.array([b"v"], pa.binary())], names=["value"])
    kept = held_slot(settings, "q", 0, 0, None)
    lost = Producer({"bootstrap.servers": bootstrap, "transactional.id": "q-0"})
    try:
        assert kept.batches_done == 0 and kept.write(0, [rows], lambda count: None) == 1
        # Batch 1 on another executor: it fences the kept slot, stages its progress and is lost.
        lost.init_transactions(30)
        lost.begin_transaction()
        progress = TopicPartition("progress", 0, 2)
        lost.send_offsets_to_transaction([progress], kept.progress.consumer_group_metadata(), 30)
        assert held_slot(settings, "q", 0, 1, kept) is kept
        with pytest.raises(KafkaException):
            kept.write(1, [rows], lambda count: None)
    finally:
        kept.abandon()
        lost.flush(1)
    retry = held_slot(settings, "q", 0, 1, None)
    try:
        assert retry.batches_done == 1
        assert retry.write(1, [rows], lambda count: None) == 1
    finally:
        retry.close()
    assert values(read_to_end(bootstrap, "out", 1, "read_committed")) == ["v", "v"]
    # Not with other settings, nor once other producers landed batches (its count falls short).
    slot = held_slot(settings, "q", 0, 2, None)
    assert held_slot(settings, "q", 0, 2, slot) is slot
    for batch_id, wanted in ((3, settings), (2, dataclasses.replace(settings, topic="elsewhere"))):
        built = held_slot(wanted, "q", 0, batch_id, slot)
        assert built is not slot
        slot = built
    slot.close()


# A stand-in for PySpark's worker loop: `whole_input` looks for `infile` in `pyspark.worker.main`.
_WORKER_MODULE = """
def main(infile, outfile):
    return list(whole_input(batches))
"""
_END_OF_STREAM = b"\xff\xff\xff\xfc"  # what the JVM sends right after a task's whole input


def run_in_worker(infile: BinaryIO, batches: list[pa.RecordBatch], module_name: str) -> list[pa.RecordBatch]:
    spec = types.SimpleNamespace(name="pyspark.worker")
    module = {"__name__": module_name, "__spec__": spec, "whole_input": whole_input, "batches": batches}
    exec(_WORKER_MODULE, module)
    return list(module["main"](infile, None))


@pytest.mark.parametrize("module_name", ["pyspark.worker", "__main__"])  # under Spark's daemon, or not
@pytest.mark.parametrize(
    ("after_the_data", "cut_off"),
    [
        ("end-of-stream, still in the socket", False),
        ("end-of-stream, already read into the worker's buffer", False),
        ("end-of-stream, then the socket closed", False),
        ("the socket closed", True),
        ("the connection reset", True),
    ],
)
def test_a_write_task_whose_socket_closed_right_after_its_batches_was_cut_off(
    after_the_data: str, cut_off: bool, module_name: str
) -> None:
    batch = pa.record_batch([pa.array([1, 2])], names=["x"])
    with socket.create_server(("127.0.0.1", 0)) as server:
        jvm_end = socket.create_connection(server.getsockname())
        worker_end, _ = server.accept()
    with worker_end, jvm_end, worker_end.makefile("rb") as infile:
        if after_the_data.startswith("end-of-stream"):
            jvm_end.sendall(_END_OF_STREAM)
            if "buffer" in after_the_data:
                assert infile.peek(4)[:4] == _END_OF_STREAM
        if after_the_data.endswith("closed"):
            jvm_end.shutdown(socket.SHUT_WR)  # what a killed task's JVM does, by closing
        if after_the_data.endswith("reset"):
            jvm_end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            jvm_end.close()
        if cut_off:
            with pytest.raises(InputCutOff):
                run_in_worker(infile, [batch, batch], module_name)
        else:
            assert run_in_worker(infile, [batch, batch], module_name) == [batch, batch]
            assert infile.read(4) == _END_OF_STREAM  # only peeked at: PySpark reads it next


def test_a_write_task_whose_jvm_is_still_there_is_not_held_up() -> None:
    batch = pa.record_batch([pa.array([1])], names=["x"])
    worker_end, jvm_end = socket.socketpair()
    with worker_end, jvm_end, worker_end.makefile("rb") as infile:
        assert run_in_worker(infile, [batch], "pyspark.worker") == [batch]


def test_the_latest_offsets_never_move_back_below_where_the_last_batch_ended(broker: EmbeddedBroker) -> None:
    # A new leader whose high watermark lags reports a lower last stable offset for a while: a
    # batch planned from it would end before the last one did, and the next read the gap twice.
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 2))
    produce_transactions(bootstrap, "in", [f"v{n}" for n in range(10)], 5, 0, "feed")
    reader = OnceflowStreamReader({"kafka.bootstrap.servers": bootstrap, "subscribe": "in"})
    try:
        now = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        ahead = {"in": {partition: offset + 5 for partition, offset in now["in"].items()}}
        assert reader.latestOffset(ahead, ReadAllAvailable()) == ahead
    finally:
        reader.stop()
