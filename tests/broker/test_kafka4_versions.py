"""The Fetch, Produce and ListOffsets versions of Kafka 4.x clients, byte for byte: topics by id
(KIP-516), the leaders' endpoints (KIP-951) and the tiered-storage timestamps of ListOffsets."""

from __future__ import annotations

import logging
import re
import time
import uuid
from types import SimpleNamespace
from typing import Any

from confluent_kafka import Consumer, Producer
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from onceflow.apis.common import leader_endpoints
from onceflow.broker.core import Endpoint
from tests.wire import WireClient, make_batch, produce

TOPIC = "t4"


def _topic_id(wire: WireClient, topic: str) -> uuid.UUID:
    response = wire.request(
        3,
        12,
        topics=[{"name": topic, "topic_id": None}],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    topic_id: uuid.UUID = response.topics[0].topic_id
    return topic_id


def test_fetch_names_topics_by_id_from_v13(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as wire:
        wire.create_topic(TOPIC, 1)
        assert produce(wire, TOPIC, 0, make_batch([b"a", b"b"])).error_code == ErrorCode.none
        topic_id = _topic_id(wire, TOPIC)
        for version in range(13, 19):
            response = wire.fetch({topic_id: [0]}, version)
            topic = response.responses[0]
            partition = topic.partitions[0]
            assert topic.topic_id == topic_id, version
            assert (partition.error_code, partition.high_watermark) == (ErrorCode.none, 2), version
            assert partition.records, version
            if version >= 16:
                assert response.node_endpoints == ()  # no partition names another leader

        unknown = uuid.uuid4()
        topic = wire.fetch({unknown: [0]}, 13).responses[0]
        assert topic.topic_id == unknown
        assert topic.partitions[0].error_code == ErrorCode.unknown_topic_id
        assert topic.partitions[0].records == b""

        # A follower's tagged fields (v15 replica state, v18 high watermark) decode and change
        # nothing for the answer.
        response = wire.fetch({topic_id: [0]}, 18, replica_state={"replica_epoch": 4}, high_watermark=1)
        assert response.responses[0].partitions[0].high_watermark == 2


def test_produce_v10_to_v13_answer_with_kafka_4_fields(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as wire:
        wire.create_topic(TOPIC, 1)
        topic_id = _topic_id(wire, TOPIC)
        for version in (10, 11, 12):
            answer = produce(wire, TOPIC, 0, make_batch([b"x"]), version=version)
            assert answer.error_code == ErrorCode.none, version
            assert answer.current_leader.leader_id == -1  # only NOT_LEADER_OR_FOLLOWER names one
        missing = produce(wire, TOPIC, 7, make_batch([b"x"]), version=11)
        assert missing.error_code == ErrorCode.unknown_topic_or_partition
        assert (missing.current_leader.leader_id, missing.current_leader.leader_epoch) == (-1, -1)

        def by_id(topic: uuid.UUID, partition: int) -> Any:
            return wire.request(
                0,
                13,
                transactional_id=None,
                acks=-1,
                timeout=10_000,
                topic_data=[
                    {
                        "topic_id": topic,
                        "partition_data": [{"index": partition, "records": make_batch([b"y"])}],
                    }
                ],
            )

        response = by_id(topic_id, 0)
        assert response.responses[0].topic_id == topic_id
        assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
        assert response.responses[0].partition_responses[0].base_offset == 3
        assert response.node_endpoints == ()
        unknown = by_id(uuid.uuid4(), 0).responses[0].partition_responses[0]
        assert unknown.error_code == ErrorCode.unknown_topic_id
        assert by_id(topic_id, 5).responses[0].partition_responses[0].error_code == (
            ErrorCode.unknown_topic_or_partition
        )
        assert wire.list_offset(TOPIC, 0) == 4  # the unknown id and partition wrote nothing


def _list_offset(wire: WireClient, version: int, timestamp: int) -> Any:
    response = wire.request(
        2,
        version,
        replica_id=-1,
        isolation_level=0,
        timeout=10_000,
        topics=[{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": timestamp}]}],
    )
    return response.topics[0].partitions[0]


def test_list_offsets_v1_has_no_isolation_level_and_reads_uncommitted(broker: EmbeddedBroker) -> None:
    # aiokafka sends v1; the fuzzer found it raising inside the broker once v1 was served.
    with WireClient(broker.bootstrap_servers) as wire:
        wire.create_topic(TOPIC, 1)
        assert produce(wire, TOPIC, 0, make_batch([b"a", b"b"])).error_code == ErrorCode.none
        response = wire.request(
            2,
            1,
            replica_id=-1,
            topics=[{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
        )
        latest = response.topics[0].partitions[0]
        assert (latest.error_code, latest.offset) == (ErrorCode.none, 2)


def test_list_offsets_tiered_storage_timestamps_without_tiered_storage(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as wire:
        wire.create_topic(TOPIC, 1)
        assert produce(wire, TOPIC, 0, make_batch([b"a", b"b", b"c"])).error_code == ErrorCode.none
        deleted = wire.request(
            21,
            2,
            topics=[{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 1}]}],
            timeout=10_000,
        )
        assert deleted.topics[0].partitions[0].low_watermark == 1

        earliest_local = _list_offset(wire, 8, -4)  # the local log is the whole log
        assert (earliest_local.error_code, earliest_local.offset) == (ErrorCode.none, 1)
        tiered = _list_offset(wire, 9, -5)  # nothing is tiered
        assert (tiered.error_code, tiered.timestamp, tiered.offset, tiered.leader_epoch) == (
            ErrorCode.none,
            -1,
            -1,
            -1,
        )
        assert _list_offset(wire, 10, -1).offset == 3
        assert _list_offset(wire, 10, -2).offset == 1

        # A special timestamp older than the request's version, or none Kafka knows (-6, earliest
        # pending upload, is Kafka 4.2's v11, which this broker does not advertise).
        for version, timestamp in ((6, -3), (7, -4), (8, -5), (10, -6), (10, -7)):
            answer = _list_offset(wire, version, timestamp)
            assert answer.error_code == ErrorCode.unsupported_version, (version, timestamp)


def test_leader_endpoints_name_the_leaders_of_moved_partitions() -> None:
    here = Endpoint(3, "broker3", 9093)
    request: Any = SimpleNamespace(broker=SimpleNamespace(known_endpoints=lambda: [here]))
    partitions = [
        {
            "error_code": ErrorCode.not_leader_or_follower,
            "current_leader": {"leader_id": 3, "leader_epoch": 2},
        },
        {
            "error_code": ErrorCode.not_leader_or_follower,
            "current_leader": {"leader_id": 4, "leader_epoch": 1},
        },
        {"error_code": ErrorCode.none},
    ]
    moved = (ErrorCode.not_leader_or_follower,)
    assert leader_endpoints(request, partitions, moved) == [
        {"node_id": 3, "host": "broker3", "port": 9093, "rack": None}
    ]
    assert leader_endpoints(request, partitions[2:], moved) == []


def test_api_versions_advertise_no_transaction_version_feature(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as wire:
        response = wire.request(18, 3, client_software_name="probe", client_software_version="1")
    assert response.supported_features == ()
    assert response.finalized_features == ()


def test_librdkafka_uses_the_new_versions_and_still_adds_partitions_to_transactions(
    broker: EmbeddedBroker,
) -> None:
    """Without `transaction.version` 2 a client must send AddPartitionsToTxn before producing."""
    sent: list[str] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            sent.extend(re.findall(r"Sent (\w+Request \(v\d+)", record.getMessage()))

    logger = logging.getLogger(f"rdkafka-{id(sent)}")
    logger.addHandler(Recorder())
    logger.setLevel(logging.DEBUG)
    with WireClient(broker.bootstrap_servers) as wire:
        wire.create_topic(TOPIC, 1)
    bootstrap = broker.bootstrap_servers
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": "k4", "debug": "protocol", "logger": logger}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(TOPIC, b"aborted")
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(TOPIC, b"committed")
    producer.commit_transaction(30)
    producer.flush(10)  # serves the queued debug logs
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "k4",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "debug": "protocol",
            "logger": logger,
        }
    )
    consumer.subscribe([TOPIC])
    values = []
    deadline = time.monotonic() + 20
    while not values and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            values.append(message.value())
    # The debug logs are served by poll, apart from the messages: wait for the fetch's.
    while not any(entry.startswith("Fetch") for entry in sent) and time.monotonic() < deadline:
        consumer.poll(0.1)
    consumer.close()
    assert values == [b"committed"]
    versions = {name: int(version) for name, version in (entry.split("Request (v") for entry in sent)}
    assert "AddPartitionsToTxn" in versions
    assert versions["Produce"] >= 10
    assert versions["Fetch"] >= 13  # by topic id
