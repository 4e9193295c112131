"""DeleteRecords (21) through confluent-kafka's AdminClient: the new log start is what fetches
and ListOffsets see, whole segments below it go, and it survives a SIGKILL."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from tests.conftest import BrokerProcess
from tests.wire import WireClient

pytestmark = pytest.mark.timeout(60)


def _setup(bootstrap: str, topic: str, records: int, config: dict[str, str] | None = None) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, config=config or {})])[topic].result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for index in range(records):
        producer.produce(topic, f"record-{index}".encode(), partition=0)
        producer.poll(0)
        producer.flush(10)  # one batch per record: many small segments
    return admin


def _delete(admin: AdminClient, topic: str, partition: int, offset: int) -> int:
    wanted = TopicPartition(topic, partition, offset)
    return int(admin.delete_records([wanted], request_timeout=10)[wanted].result(10).low_watermark)


def _delete_error(admin: AdminClient, topic: str, partition: int, offset: int) -> int:
    with pytest.raises(KafkaException) as failure:
        _delete(admin, topic, partition, offset)
    return int(failure.value.args[0].code())


def _earliest(admin: AdminClient, topic: str, partition: int) -> int:
    key = TopicPartition(topic, partition)
    return int(admin.list_offsets({key: OffsetSpec.earliest()}, request_timeout=10)[key].result(10).offset)


def _first_fetched(bootstrap: str, topic: str, offset: int, reset: str) -> tuple[int | None, int | None]:
    """(offset of the first record read from `offset`, error code), one of them None."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reader",
            "auto.offset.reset": reset,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                return None, int(message.error().code())
            return int(message.offset()), None
        raise AssertionError("nothing read")
    finally:
        consumer.close()


def test_delete_records_moves_the_log_start(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "data") as broker:
        admin = _setup(broker.bootstrap_servers, "trimmed", 20, {"segment.bytes": "300"})
        segments_before = sorted(int(p.stem) for p in (tmp_path / "data" / "trimmed-0").glob("*.log"))
        assert len(segments_before) > 3

        assert _delete(admin, "trimmed", 0, 13) == 13
        assert _earliest(admin, "trimmed", 0) == 13
        # Whole segments below 13 are gone; the one holding 13 stays.
        segments = sorted(int(p.stem) for p in (tmp_path / "data" / "trimmed-0").glob("*.log"))
        assert segments[0] <= 13 and (len(segments) == 1 or segments[1] > 13)
        assert len(segments) < len(segments_before)
        # A fetch below the start is OFFSET_OUT_OF_RANGE; reading from the earliest starts at 13.
        assert _first_fetched(broker.bootstrap_servers, "trimmed", 5, "error") == (
            None,
            KafkaError._AUTO_OFFSET_RESET,
        )
        assert _first_fetched(broker.bootstrap_servers, "trimmed", 5, "earliest") == (13, None)

        assert _delete(admin, "trimmed", 0, 4) == 13  # below the start: nothing changes
        assert _delete_error(admin, "trimmed", 0, 21) == KafkaError.OFFSET_OUT_OF_RANGE
        assert _delete_error(admin, "trimmed", 0, -5) == KafkaError.OFFSET_OUT_OF_RANGE
        assert _delete(admin, "trimmed", 0, -1) == 20  # the high watermark
        assert _delete(admin, "trimmed", 1, -1) == 0  # an empty partition
        # librdkafka refuses a partition it does not know before asking; the broker's answers:
        with WireClient(broker.bootstrap_servers) as wire:
            assert _wire_delete(wire, "trimmed", 7) == ErrorCode.unknown_topic_or_partition
            assert _wire_delete(wire, "__consumer_offsets", 0) == ErrorCode.policy_violation


def _wire_delete(wire: WireClient, topic: str, partition: int) -> ErrorCode:
    response = wire.request(
        21,
        2,
        topics=[{"name": topic, "partitions": [{"partition_index": partition, "offset": 0}]}],
        timeout=5000,
    )
    return ErrorCode(response.topics[0].partitions[0].error_code)


def test_the_log_start_survives_sigkill(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        admin = _setup(broker.bootstrap_servers, "kept", 10)
        assert _delete(admin, "kept", 0, 6) == 6
        broker.restart()  # SIGKILL, then start again
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        assert _earliest(admin, "kept", 0) == 6
        assert _first_fetched(broker.bootstrap_servers, "kept", 0, "earliest") == (6, None)
    finally:
        broker.kill()
