"""The broker advertises one Kafka release's versions of every API it has (Kafka 4.1, the latest
whose every version it serves), so a client pinned to that release's table, or an older one,
sends nothing the broker cannot read. kafka-python pins a release with `api_version` (and then
skips ApiVersions); the oracle for each table is kafka-python's own, taken from real brokers."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.broker_version_data import BROKER_API_VERSIONS
from kafka.structs import OffsetAndMetadata

from onceflow import EmbeddedBroker
from onceflow.apis import ADVERTISED_VERSIONS, SUPPORTED_VERSIONS
from onceflow.apis.api_versions import KAFKA_RELEASE
from tests.conftest import FAST_JOINS, wait_until
from tests.wire import WireClient

CLAIMED = (4, 1)
OLDER = (4, 0)  # the pin of the issue: every client so configured failed at bootstrap


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tmp_path_factory.mktemp("releases") / "data", config=FAST_JOINS) as running:
        yield running


def _table(release: tuple[int, int]) -> dict[int, tuple[int, int]]:
    """A release's versions of the APIs this broker has."""
    return {
        key: versions for key, versions in BROKER_API_VERSIONS[release].items() if key in ADVERTISED_VERSIONS
    }


def test_api_versions_answers_exactly_the_claimed_releases_table(broker: EmbeddedBroker) -> None:
    assert ".".join(map(str, CLAIMED)) == KAFKA_RELEASE
    with WireClient(broker.bootstrap_servers) as wire:
        answer = wire.request(18, 4, client_software_name="probe", client_software_version="1")
    advertised = {int(api.api_key): (int(api.min_version), int(api.max_version)) for api in answer.api_keys}
    assert set(advertised) <= set(BROKER_API_VERSIONS[CLAIMED])  # no API 4.1 lacks
    assert advertised == _table(CLAIMED)
    # Served: every version of the table, but Produce v0-2, which Kafka 4 lists and refuses too.
    for key, (low, high) in advertised.items():
        served = SUPPORTED_VERSIONS[key]
        assert served.max == high and served.min == (3 if key == 0 else low), key
    # The controls: the older release's table differs (so the comparison tells them apart), and
    # the newer one's has versions this broker does not serve (4.1 is the latest it can claim).
    assert _table(OLDER) != advertised
    newer = _table((4, 2))
    assert any(newer[key][1] > SUPPORTED_VERSIONS[key].max for key in newer)


def test_a_version_past_the_release_closes_the_connection(broker: EmbeddedBroker) -> None:
    """What a client pinned to a newer table meets: OffsetFetch v10 is Kafka 4.2's."""
    fetch = {"groups": [{"group_id": "nobody", "member_id": None, "member_epoch": -1, "topics": None}]}
    with WireClient(broker.bootstrap_servers) as wire:
        assert wire.request(9, 9, require_stable=False, **fetch).groups[0].group_id == "nobody"
    with WireClient(broker.bootstrap_servers) as wire, pytest.raises(ConnectionError):
        wire.request(9, 10, require_stable=False, **fetch)


@pytest.mark.parametrize("pin", [CLAIMED, OLDER], ids=["4.1", "4.0"])
def test_kafka_python_pinned_to_a_release_produces_fetches_joins_groups_and_commits_transactions(
    broker: EmbeddedBroker, pin: tuple[int, int]
) -> None:
    name = f"pinned-{pin[0]}-{pin[1]}"
    common: dict[str, Any] = {"bootstrap_servers": broker.bootstrap_servers, "api_version": pin}
    source, sink = f"{name}-in", f"{name}-out"
    plain = KafkaProducer(acks="all", enable_idempotence=True, **common)
    for index in range(3):
        plain.send(source, f"in-{index}".encode(), partition=0)
    plain.flush(30)
    plain.close()

    consumer = KafkaConsumer(
        group_id=name,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        **common,
    )
    # Subscribed once its metadata is known: a group leader that assigns before its metadata
    # has the topic assigns it to nobody, until the next refresh minutes later (a loaded machine).
    wait_until(lambda: consumer.partitions_for_topic(source), 30)
    consumer.subscribe([source])
    records = _poll(consumer, 3)
    assert [record.value for record in records] == [b"in-0", b"in-1", b"in-2"]

    # Consume-transform-produce: the offsets commit with the output, or neither does.
    producer = KafkaProducer(transactional_id=name, **common)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(sink, b"aborted", partition=0)
    producer.abort_transaction()
    producer.begin_transaction()
    for record in records:
        producer.send(sink, record.value.replace(b"in", b"out"), partition=0)
    producer.send_offsets_to_transaction(
        {TopicPartition(source, 0): OffsetAndMetadata(3, "", -1)}, consumer.group_metadata()
    )
    producer.commit_transaction()
    producer.close()
    assert consumer.committed(TopicPartition(source, 0)) == 3
    consumer.close()

    reader = KafkaConsumer(
        sink,
        group_id=f"{name}-reader",
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **common,
    )
    assert [record.value for record in _poll(reader, 3)] == [b"out-0", b"out-1", b"out-2"]
    reader.close()


def _poll(consumer: KafkaConsumer, count: int) -> list[Any]:
    records: list[Any] = []
    deadline = time.monotonic() + 30
    while len(records) < count and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            records += batch
    return records


def test_librdkafka_reads_the_claimed_releases_table(tmp_path: Path) -> None:
    """confluent-kafka asks ApiVersions: what it read, from its own debug log, is the table."""
    read: dict[int, tuple[int, int]] = {}

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            for key, low, high in re.findall(
                r"ApiKey \S+ \((\d+)\) Versions (\d+)\.\.(\d+)", record.getMessage()
            ):
                read[int(key)] = (int(low), int(high))

    logger = logging.getLogger(f"rdkafka-{uuid.uuid4()}")
    logger.addHandler(Recorder())
    logger.setLevel(logging.DEBUG)
    with EmbeddedBroker(tmp_path / "data") as broker:
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap_servers, "debug": "feature,protocol", "logger": logger}
        )
        deadline = time.monotonic() + 20
        while len(read) < len(ADVERTISED_VERSIONS) and time.monotonic() < deadline:
            producer.poll(0.1)
        producer.flush(5)
    assert read == _table(CLAIMED)


def test_a_single_broker_needs_no_election(broker: EmbeddedBroker) -> None:
    """ElectLeaders (43): a single broker leads every partition it has already."""
    with WireClient(broker.bootstrap_servers) as wire:
        assert wire.create_topic("elected", 1) == 0
        named = wire.request(
            43,
            2,
            election_type=0,
            topic_partitions=[{"topic": "elected", "partitions": [0, 5]}],
            timeout=5000,
        )
        every = wire.request(43, 1, election_type=1, topic_partitions=None, timeout=5000)
    assert named.error_code == 0
    results = {
        int(r.partition_id): (r.error_code, r.error_message)
        for r in named.replica_election_results[0].partition_result
    }
    assert results[0][0] == 84 and results[5][0] == 3  # ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION
    assert (every.error_code, every.replica_election_results) == (0, ())  # none needed: none listed
