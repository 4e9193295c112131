"""The source's own Fetch client against confluent-kafka's consumer: the same rows from the same
ranges, aborted transactions, compression, headers and all; and its record walk on bytes alone."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from hypothesis import given
from hypothesis import strategies as st

from onceflow import EmbeddedBroker
from onceflow._recordcolumns import Columns
from onceflow.spark import fetching, source
from onceflow.spark.fetching import plain_enough
from onceflow.spark.rows import batch_of_columns
from onceflow.spark.source import OffsetRange, ReadTask, read_task
from tests.conftest import FAST_JOINS
from tests.spark.helpers import produce_transactions
from tests.spark.test_data_source import create

CODECS = ("gzip", "snappy", "lz4", "zstd")
# Any librdkafka setting sends a task through confluent-kafka: the reference.
THROUGH_CONFLUENT_KAFKA = {"check.crcs": "false"}


def read_rows(config: dict[str, str], task: ReadTask) -> pa.Table:
    try:
        batches = list(read_task(config, task, 30))
    finally:
        for consumer in source._idle_consumers.values():
            consumer.close()
        source._idle_consumers.clear()
        for fetcher in source._idle_fetchers.values():
            fetcher.close()
        source._idle_fetchers.clear()
    return pa.Table.from_batches(batches, schema=source.ARROW_SCHEMA).sort_by(
        [("partition", "ascending"), ("offset", "ascending")]
    )


def test_a_plain_config_takes_the_fetcher_and_any_other_setting_confluent_kafka() -> None:
    assert plain_enough({"bootstrap.servers": "h:1", "client.id": "me", "security.protocol": "PLAINTEXT"})
    assert not plain_enough({"bootstrap.servers": "h:1", **THROUGH_CONFLUENT_KAFKA})
    assert not plain_enough({"bootstrap.servers": "h:1", "security.protocol": "SSL"})


@dataclass(frozen=True)
class MixedTopic:
    """A topic of committed and aborted transactions, every codec, headers, null keys and values."""

    bootstrap: str
    task: ReadTask
    aborted: set[bytes]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MixedTopic]:
    with EmbeddedBroker(tmp_path_factory.mktemp("mixed") / "data", config=FAST_JOINS) as running:
        bootstrap = running.bootstrap_servers
        create(bootstrap, ("in", 3))
        transactional = [f"t{n}" for n in range(400)]
        committed = produce_transactions(bootstrap, "in", transactional, 40, 3, "feed")
        for codec in CODECS:
            producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20})
            for n in range(300):
                headers = [("h", f"{codec}{n}".encode()), ("empty", None)] if n % 7 == 0 else None
                key = None if n % 5 == 0 else f"k{n}".encode()
                value = None if n % 11 == 0 else f"{codec}-{n}".encode() * (n % 13)
                producer.produce("in", value, key, partition=n % 3, timestamp=1_000_000 + n, headers=headers)
            assert producer.flush(30) == 0
        # The precondition: the log holds aborted records that read_committed must leave out.
        assert sum(end_offset(bootstrap, p, "read_uncommitted") for p in range(3)) > len(committed) + 4 * 300
        ends = [end_offset(bootstrap, p, "read_committed") for p in range(3)]  # the ends a trigger plans
        ranges = (
            OffsetRange("in", 0, 0, ends[0]),
            OffsetRange("in", 1, 37, ends[1] - 3),
            OffsetRange("in", 2, 211, 212),
        )
        yield MixedTopic(
            bootstrap, ReadTask(ranges), {value.encode() for value in set(transactional) - set(committed)}
        )


def test_the_fetcher_reads_the_rows_confluent_kafka_reads(mixed: MixedTopic) -> None:
    fetched = read_rows({"bootstrap.servers": mixed.bootstrap}, mixed.task)
    consumed = read_rows({"bootstrap.servers": mixed.bootstrap, **THROUGH_CONFLUENT_KAFKA}, mixed.task)
    assert fetched.num_rows > 900
    assert fetched.equals(consumed)
    assert not mixed.aborted & set(fetched.column("value").to_pylist())


def test_control_a_fetcher_blind_to_transactions_reads_aborted_records(
    mixed: MixedTopic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetching, "_TRANSACTIONAL", 0)
    fetched = read_rows({"bootstrap.servers": mixed.bootstrap}, mixed.task)
    assert mixed.aborted & set(fetched.column("value").to_pylist())
    assert not fetched.equals(
        read_rows({"bootstrap.servers": mixed.bootstrap, **THROUGH_CONFLUENT_KAFKA}, mixed.task)
    )


def end_offset(bootstrap: str, partition: int, isolation_level: str) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "ends", "isolation.level": isolation_level}
    )
    try:
        return int(consumer.get_watermark_offsets(TopicPartition("in", partition), timeout=30)[1])
    finally:
        consumer.close()


def test_a_range_that_starts_before_the_log_reads_from_its_start(broker: EmbeddedBroker) -> None:
    bootstrap = broker.bootstrap_servers
    create(bootstrap, ("in", 1))
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(20):
        producer.produce("in", f"v{n}".encode(), partition=0)
        producer.flush(30)  # a batch each, so the log can start between them
    wanted = TopicPartition("in", 0, 12)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert admin.delete_records([wanted], request_timeout=10)[wanted].result(10).low_watermark == 12
    task = ReadTask((OffsetRange("in", 0, 0, 20),))
    fetched = read_rows({"bootstrap.servers": bootstrap}, task)
    assert fetched.column("value").to_pylist() == [f"v{n}".encode() for n in range(12, 20)]
    assert fetched.equals(read_rows({"bootstrap.servers": bootstrap, **THROUGH_CONFLUENT_KAFKA}, task))


def varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    return bytes(out + bytes([raw]))


def record(
    offset_delta: int, key: bytes | None, value: bytes | None, headers: list[tuple[bytes, bytes | None]]
) -> bytes:
    def field(data: bytes | None) -> bytes:
        return varint(-1) if data is None else varint(len(data)) + data

    body = b"\0" + varint(10 * offset_delta) + varint(offset_delta) + field(key) + field(value)
    body += varint(len(headers)) + b"".join(varint(len(name)) + name + field(data) for name, data in headers)
    return varint(len(body)) + body


RECORDS = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=5),
        st.none() | st.binary(max_size=5),
        st.lists(
            st.tuples(st.text(max_size=3).map(str.encode), st.none() | st.binary(max_size=3)), max_size=2
        ),
    ),
    min_size=1,
    max_size=12,
)


@given(RECORDS, st.integers(0, 12), st.integers(0, 12), st.booleans())
def test_the_record_walk_keeps_every_field_of_the_records_in_range(
    records: list[tuple[bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]],
    first: int,
    end: int,
    log_append_time: bool,
) -> None:
    base = 1000
    section = b"".join(record(index, *fields) for index, fields in enumerate(records))
    columns = Columns()
    added = columns.add(section, len(records), base, 5_000, log_append_time, 9_999, base + first, base + end)
    kept = [(index, fields) for index, fields in enumerate(records) if first <= index < end]
    assert added == columns.rows == len(kept)
    rows = batch_of_columns(columns.take(), "t", 7).to_pylist()
    assert columns.rows == 0
    expected = [
        {
            "key": key,
            "value": value,
            "topic": "t",
            "partition": 7,
            "offset": base + index,
            "timestamp": 9_999 if log_append_time else 5_000 + 10 * index,
            "timestampType": int(log_append_time),
            "headers": [{"key": name.decode(), "value": data} for name, data in headers],
        }
        for index, (key, value, headers) in kept
    ]
    for row in rows:
        row["timestamp"] = round(row["timestamp"].timestamp() * 1000)
    assert rows == expected


@given(RECORDS, st.data())
def test_a_damaged_batch_adds_nothing_and_leaves_the_rows_before_it(
    records: list[tuple[bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]], data: st.DataObject
) -> None:
    section = b"".join(record(index, *fields) for index, fields in enumerate(records))
    columns = Columns()
    columns.add(record(0, b"k", b"kept", [(b"h", b"v")]), 1, 0, 0, False, 0, 0, 10)
    cut = data.draw(st.integers(0, len(section) - 1))
    damage = data.draw(st.sampled_from(["cut", "count", "flip"]))
    if damage == "cut":
        damaged, count = section[:cut], len(records)
    elif damage == "count":
        damaged, count = section, len(records) + 1
    else:
        damaged, count = section[:cut] + bytes([section[cut] ^ 0xFF]) + section[cut + 1 :], len(records)
    try:
        columns.add(damaged, count, 100, 0, False, 0, 0, 1_000)
    except ValueError:
        pass
    else:
        # A flipped byte can make other records that still fit; then every one of them is read.
        assert damage == "flip"
        return
    rows = batch_of_columns(columns.take(), "t", 0).to_pylist()
    assert [(row["value"], row["headers"]) for row in rows] == [(b"kept", [{"key": "h", "value": b"v"}])]


def test_a_record_longer_than_its_batch_is_refused() -> None:
    section = record(0, b"k", b"value", [])
    with pytest.raises(ValueError, match="runs past the end"):
        Columns().add(section[:-1], 1, 0, 0, False, 0, 0, 10)
    with pytest.raises(ValueError, match="follow the 1 records"):
        Columns().add(section + b"\0", 1, 0, 0, False, 0, 0, 10)
    lying = varint(2**31 - 1) + section[1:]
    with pytest.raises(ValueError):
        Columns().add(lying, 1, 0, 0, False, 0, 0, 10)
    assert struct.calcsize(">qiibIhiqqqhii") == 61  # the batch header the fetcher reads
