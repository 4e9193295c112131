"""Bad input gets the right error code or a closed connection, and never hurts the broker or its log."""

from __future__ import annotations

import hashlib
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from tests.wire import WireClient, make_batch, produce

TOPIC = "victim"


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(
        tmp_path_factory.mktemp("bad-input"), config={"message.max.bytes": "100000"}
    ) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(timeout=30)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True})
        for number in range(100):
            producer.produce(TOPIC, key=str(number), value=f"kept-{number}")
        assert producer.flush(30) == 0
        yield broker


def _log_fingerprint(broker: EmbeddedBroker) -> str:
    digest = hashlib.sha256()
    for path in sorted((broker.data_dir).glob(f"{TOPIC}-*/*.log")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _still_serving(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as wire:
        response = wire.request(18, 3, client_software_name="probe", client_software_version="1")
        assert response.error_code == ErrorCode.none


def _send_and_drain(address: str, payload: bytes) -> None:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(2)
        try:
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=200),
        st.builds(
            lambda key, version, body: (
                struct.pack(">ihhi", 8 + len(body) + 2, key, version, 1) + b"\0\0" + body
            ),
            st.integers(-5, 80),
            st.integers(-2, 30),
            st.binary(max_size=120),
        ),
        st.builds(
            lambda size, tail: struct.pack(">i", size) + tail,
            st.sampled_from([-1, 0, 3, 2**31 - 1, 200 * 1024 * 1024]),
            st.binary(max_size=40),
        ),
    )
)
def test_garbage_never_hurts_the_broker(shared_broker: EmbeddedBroker, payload: bytes) -> None:
    before = _log_fingerprint(shared_broker)
    _send_and_drain(shared_broker.bootstrap_servers, payload)
    _still_serving(shared_broker)
    assert _log_fingerprint(shared_broker) == before


def test_mutated_produce_requests_change_nothing_they_should_not(shared_broker: EmbeddedBroker) -> None:
    """Flip each byte of a valid produce frame in turn: every outcome leaves the stored data intact."""
    batch = make_batch([b"mutant"])
    with WireClient(shared_broker.bootstrap_servers) as wire:
        before_end = wire.list_offset(TOPIC, 0)
    for position in range(4, 4 + 60):
        mutated = bytearray(_produce_frame(batch))
        mutated[position] ^= 0xFF
        _send_and_drain(shared_broker.bootstrap_servers, bytes(mutated))
    _still_serving(shared_broker)
    with WireClient(shared_broker.bootstrap_servers) as wire:
        # A mutation may turn into a valid produce of the batch elsewhere, never into a corrupt store.
        assert wire.list_offset(TOPIC, 0) >= before_end


def _produce_frame(batch: bytes) -> bytes:
    client = WireClient.__new__(WireClient)
    client._correlation_id = 0
    return client.frame(
        0,
        9,
        transactional_id=None,
        acks=-1,
        timeout=5000,
        topic_data=[{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}],
    )[1]


def test_bad_crc_is_corrupt_message(shared_broker: EmbeddedBroker) -> None:
    batch = bytearray(make_batch([b"will be corrupted"]))
    batch[-1] ^= 0x01
    before = _log_fingerprint(shared_broker)
    with WireClient(shared_broker.bootstrap_servers) as wire:
        assert produce(wire, TOPIC, 0, bytes(batch)).error_code == ErrorCode.corrupt_message
    assert _log_fingerprint(shared_broker) == before


def test_oversized_batch_is_message_too_large(shared_broker: EmbeddedBroker) -> None:
    batch = make_batch([b"x" * 150_000])
    before = _log_fingerprint(shared_broker)
    with WireClient(shared_broker.bootstrap_servers) as wire:
        assert produce(wire, TOPIC, 0, batch).error_code == ErrorCode.message_too_large
    assert _log_fingerprint(shared_broker) == before


def test_oversized_frame_closes_only_that_connection(shared_broker: EmbeddedBroker) -> None:
    with (
        WireClient(shared_broker.bootstrap_servers) as bystander,
        WireClient(shared_broker.bootstrap_servers) as bad,
    ):
        bad.send_raw(struct.pack(">i", 500 * 1024 * 1024) + b"\0" * 64)
        assert bad.connection_closed()
        response = bystander.request(18, 3, client_software_name="bystander", client_software_version="1")
        assert response.error_code == ErrorCode.none


@pytest.mark.parametrize("topic, partition", [("no-such-topic", 0), (TOPIC, 99)])
def test_unknown_topic_or_partition(shared_broker: EmbeddedBroker, topic: str, partition: int) -> None:
    with WireClient(shared_broker.bootstrap_servers) as wire:
        response = produce(wire, topic, partition, make_batch([b"nowhere"]))
        assert response.error_code == ErrorCode.unknown_topic_or_partition


def test_two_batches_in_one_partition_are_invalid_record(shared_broker: EmbeddedBroker) -> None:
    before = _log_fingerprint(shared_broker)
    with WireClient(shared_broker.bootstrap_servers) as wire:
        response = produce(wire, TOPIC, 0, make_batch([b"a"]) + make_batch([b"b"]))
        assert response.error_code == ErrorCode.invalid_record
    assert _log_fingerprint(shared_broker) == before


def test_invalid_acks(shared_broker: EmbeddedBroker) -> None:
    with WireClient(shared_broker.bootstrap_servers) as wire:
        assert (
            produce(wire, TOPIC, 0, make_batch([b"a"]), acks=2).error_code == ErrorCode.invalid_required_acks
        )


def test_min_insync_replicas_above_one(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path, config={"min.insync.replicas": "2"}) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("isr", 1, 1)])["isr"].result(timeout=30)
        with WireClient(broker.bootstrap_servers) as wire:
            assert (
                produce(wire, "isr", 0, make_batch([b"a"]), acks=-1).error_code
                == ErrorCode.not_enough_replicas
            )
            assert produce(wire, "isr", 0, make_batch([b"a"]), acks=1).error_code == ErrorCode.none


def test_api_versions_fallback_for_an_unknown_version(shared_broker: EmbeddedBroker) -> None:
    with WireClient(shared_broker.bootstrap_servers) as wire:
        header = struct.pack(">hhi", 18, 77, 42) + struct.pack(">h", -1)
        wire.send_raw(struct.pack(">i", len(header)) + header)
        response = wire.read_response(18, 0, 42)
        assert response.error_code == ErrorCode.unsupported_version
        assert any(key.api_key == 0 for key in response.api_keys)


def test_clients_cannot_write_or_delete_the_coordinators_logs(shared_broker: EmbeddedBroker) -> None:
    with WireClient(shared_broker.bootstrap_servers) as wire:
        # The internal topics exist once a coordinator is looked up, as in Kafka.
        found = wire.request(10, 4, key_type=1, coordinator_keys=["t"])
        assert found.coordinators[0].error_code == ErrorCode.none
        assert (
            produce(wire, "__consumer_offsets", 0, make_batch([b"forged"])).error_code
            == ErrorCode.invalid_topic_exception
        )
        response = wire.request(
            20, 6, topics=[{"name": "__transaction_state", "topic_id": None}], timeout=5000
        )
        assert response.responses[0].error_code == ErrorCode.invalid_topic_exception
        # Nor change their partition count: every key's partition, and its state, would move.
        grown = wire.request(
            37,
            3,
            topics=[{"name": "__transaction_state", "count": 60, "assignments": None}],
            timeout=5000,
            validate_only=False,
        )
        assert grown.results[0].error_code == ErrorCode.policy_violation
        assert wire.list_offset("__transaction_state", 0) >= 0


def _with_last_offset_delta(batch: bytes, last_offset_delta: int) -> bytes:
    """The batch claiming another last offset delta, its CRC made right again."""
    patched = bytearray(batch)
    struct.pack_into(">i", patched, 23, last_offset_delta)
    struct.pack_into(">I", patched, 17, crc32c(memoryview(patched)[21:]))
    return bytes(patched)


@pytest.mark.parametrize(
    "batch",
    [
        pytest.param(_with_last_offset_delta(make_batch([b"a", b"b", b"c"]), 0), id="3-records-1-offset"),
        pytest.param(_with_last_offset_delta(make_batch([b"a"]), 2), id="1-record-3-offsets"),
        pytest.param(make_batch([b"a"], producer_id=5, producer_epoch=0), id="producer-id-without-sequence"),
    ],
)
def test_a_batch_kafka_would_not_validate_is_refused_and_stores_nothing(batch: bytes) -> None:
    # Offsets are given out by the last offset delta (a mismatch would hand the same offset to two
    # records), and the duplicate check matches on sequences (a second batch with none would be
    # taken for a duplicate of the first, acknowledged and dropped).
    with EmbeddedBroker() as broker, WireClient(broker.bootstrap_servers) as client:
        client.create_topic(TOPIC, 1)
        for _ in range(2):
            assert produce(client, TOPIC, 0, batch).error_code == ErrorCode.invalid_record
        assert client.list_offset(TOPIC, 0) == 0
