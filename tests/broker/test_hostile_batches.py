"""One hostile batch costs the broker neither its event loop nor its memory, and real clients get
Kafka's validator answers: record errors by index, codecs applied by the topic, order kept when a
batch is validated off the event loop."""

from __future__ import annotations

import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import cramjam
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from crc32c import crc32c
from kafka import KafkaConsumer
from kio.schema.errors import ErrorCode

from tests.conftest import BrokerProcess
from tests.wire import WireClient, produce

MAX_PING_S = 0.5  # Kafka answers in milliseconds; before, one batch held every client for seconds


def _batch(values: list[bytes], key: bytes | None = b"k", codec: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for offset, value in enumerate(values):
        builder.append(offset, timestamp=int(time.time() * 1000), key=key, value=value, headers=[])
    return bytes(builder.build())


def _with_records_section(batch: bytes, body: bytes) -> bytes:
    patched = bytearray(batch[:61]) + body
    struct.pack_into(">i", patched, 8, len(patched) - 12)
    struct.pack_into(">I", patched, 17, crc32c(memoryview(patched)[21:]))
    return bytes(patched)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("hostile"), settings={"message.max.bytes": "2000000"})
    process.start()
    admin = AdminClient({"bootstrap.servers": process.bootstrap_servers})
    topics = [
        NewTopic("plain", 1, 1),
        NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact"}),
        *(NewTopic(f"stored-{codec}", 1, 1, config={"compression.type": codec}) for codec in _CODECS),
    ]
    for future in admin.create_topics(topics).values():
        future.result(timeout=30)
    yield process
    process.terminate()


_CODECS = ("gzip", "snappy", "lz4", "zstd")


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


class _Pinger(threading.Thread):
    """Another client asking the broker something every 10 ms, timing each answer."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.slowest = 0.0
        self.answers = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with WireClient(self.address) as wire:
            while not self.stop.is_set():
                started = time.perf_counter()
                wire.request(18, 3, client_software_name="pinger", client_software_version="1")
                self.slowest = max(self.slowest, time.perf_counter() - started)
                self.answers += 1
                self.stop.wait(0.01)


@pytest.mark.parametrize(
    ("topic", "records_section", "code"),
    [
        # Kafka refuses varints over 5 bytes; an unbounded reader is quadratic (seconds per 300 KB).
        pytest.param("compacted", b"\xff" * 1_000_000, ErrorCode.invalid_record, id="1MB-varint"),
        # 512 MiB of zeros in a few hundred KiB: refused at the broker's cap, never inflated whole.
        pytest.param("plain", "zstd-bomb", ErrorCode.corrupt_message, id="zstd-bomb"),
    ],
)
def test_a_hostile_batch_is_refused_while_other_clients_are_served(
    broker: BrokerProcess, topic: str, records_section: bytes | str, code: ErrorCode
) -> None:
    assert broker.process is not None
    if records_section == "zstd-bomb":
        batch = _with_records_section(
            _batch([b"v"], codec=4), bytes(cramjam.zstd.compress(b"\x00" * (512 << 20), 19))
        )
    else:
        assert isinstance(records_section, bytes)
        batch = _with_records_section(_batch([b"v"]), records_section)
    rss_before = _peak_rss_bytes(broker.process.pid)
    pinger = _Pinger(broker.bootstrap_servers)
    pinger.start()
    try:
        with WireClient(broker.bootstrap_servers, timeout_s=60) as wire:
            end_before = wire.list_offset(topic, 0)
            assert produce(wire, topic, 0, batch).error_code == code
            assert wire.list_offset(topic, 0) == end_before
            assert wire.list_offset(topic, 0, timestamp=0) in (-1, 0)  # a search by time still answers
    finally:
        pinger.stop.set()
        pinger.join(10)
    assert pinger.answers > 0
    assert pinger.slowest < MAX_PING_S, f"another client waited {pinger.slowest:.2f} s"
    assert _peak_rss_bytes(broker.process.pid) - rss_before < 256 << 20


def test_record_errors_name_the_records_a_compacted_topic_refuses(broker: BrokerProcess) -> None:
    # Kafka lists the bad records: the client fails those with INVALID_RECORD and the rest of the
    # batch with _INVALID_DIFFERENT_RECORD, which it may send again.
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 200, "retries": 0})
    outcomes: dict[int, int] = {}

    def delivered(error: KafkaError | None, message: object, index: int) -> None:
        outcomes[index] = error.code() if error is not None else 0

    for index in range(100):
        key = None if index % 10 == 7 else f"k{index}".encode()
        producer.produce(
            "compacted", key=key, value=b"v", on_delivery=lambda e, m, i=index: delivered(e, m, i)
        )
    assert producer.flush(30) == 0
    assert sorted(index for index, code in outcomes.items() if code == KafkaError.INVALID_RECORD) == list(
        range(7, 100, 10)
    )
    # On a loaded machine the client may split the 100 records into several batches: the others are
    # written (a batch without a keyless record) or refused as its batch-mates, and some are refused.
    others = [code for index, code in outcomes.items() if index % 10 != 7]
    assert len(others) == 90 and set(others) <= {0, KafkaError._INVALID_DIFFERENT_RECORD}
    assert KafkaError._INVALID_DIFFERENT_RECORD in others


@pytest.mark.parametrize("codec", _CODECS)
def test_a_topic_codec_is_applied_and_every_client_reads_it(broker: BrokerProcess, codec: str) -> None:
    topic = f"stored-{codec}"
    values = [f"{codec}-{index}".encode() * 20 for index in range(200)]
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 50})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    segment = next((broker.data_dir / f"{topic}-0").glob("*.log")).read_bytes()
    (attributes,) = struct.unpack_from(">h", segment, 21)
    assert attributes & 7 == ("none", "gzip", "snappy", "lz4", "zstd").index(codec)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    read: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(read) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read.append(message.value())
    consumer.close()
    assert read == values
    python_client = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    read = []
    for message in python_client:
        read.append(message.value)
        if len(read) == len(values):
            break
    python_client.close()
    assert read == values


def test_batches_validated_off_the_event_loop_keep_the_producers_order(broker: BrokerProcess) -> None:
    # A batch of thousands of records is validated on the broker's record thread; a small batch
    # pipelined behind it on the same connection must not be appended before it.
    with WireClient(broker.bootstrap_servers) as wire:
        init = wire.init_producer_id()
        producer_id, epoch = init.producer_id, init.producer_epoch
        heavy = _idempotent_batch(producer_id, epoch, 0, 6000)
        light = _idempotent_batch(producer_id, epoch, 6000, 3)
        sent = [wire.frame(0, 9, **_produce_fields(batch)) for batch in (heavy, light)]
        wire.send_raw(b"".join(frame for _, frame in sent))
        answers = [
            wire.read_response(0, 9, correlation_id).responses[0].partition_responses[0]
            for correlation_id, _ in sent
        ]
    assert [answer.error_code for answer in answers] == [ErrorCode.none, ErrorCode.none]
    assert answers[1].base_offset == answers[0].base_offset + 6000


def _idempotent_batch(producer_id: int, epoch: int, base_sequence: int, count: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        batch_size=1 << 24,
    )
    for offset in range(count):
        builder.append(offset, timestamp=int(time.time() * 1000), key=None, value=b"%d" % offset, headers=[])
    return bytes(builder.build())


def _produce_fields(batch: bytes) -> dict[str, object]:
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout": 10_000,
        "topic_data": [{"name": "plain", "partition_data": [{"index": 0, "records": batch}]}],
    }


def test_thousands_of_new_partitions_keep_other_clients_served(broker: BrokerProcess) -> None:
    # Their files are made on a thread: before, CreateTopics with 3,000 held the loop 5.3 s.
    pinger = _Pinger(broker.bootstrap_servers)
    pinger.start()
    try:
        with WireClient(broker.bootstrap_servers, timeout_s=120) as wire:
            assert wire.create_topic("wide", 1500) == ErrorCode.none
            assert wire.list_offset("wide", 1499) == 0
    finally:
        pinger.stop.set()
        pinger.join(10)
    assert pinger.answers > 0
    assert pinger.slowest < MAX_PING_S, f"another client waited {pinger.slowest:.2f} s"


def test_topic_names_that_differ_only_in_dot_and_underscore_collide(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap_servers) as wire:
        assert wire.create_topic("orders.eu", 1) == ErrorCode.none
        assert wire.create_topic("orders_eu", 1) == ErrorCode.invalid_topic_exception
        assert wire.create_topic("orders.eu", 1) == ErrorCode.topic_already_exists
