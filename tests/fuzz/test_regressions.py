"""Every frame a fuzzing campaign saved gets an answer or a closed connection, and hurts nothing."""

from __future__ import annotations

import hashlib
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from onceflow.faults.broker_process import BrokerProcess
from onceflow.fuzz.campaign import load_regressions
from tests.protocol.malformed import malformed_frames
from tests.wire import WireClient

REGRESSIONS = Path(__file__).parent / "regressions"
TOPIC = "kept"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    workdir = tmp_path_factory.mktemp("regressions")
    process = BrokerProcess(workdir / "data", {}, workdir / "broker.log").start()
    admin = AdminClient({"bootstrap.servers": process.address})
    admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(timeout=30)
    producer = Producer({"bootstrap.servers": process.address, "enable.idempotence": True})
    for number in range(50):
        producer.produce(TOPIC, value=f"kept-{number}")
    assert producer.flush(30) == 0
    yield process
    process.kill()


def _fingerprint(data_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(data_dir.glob(f"{TOPIC}-*/*.log")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _send(address: str, frame: bytes) -> str:
    """ "answered" or "closed": what the broker did with the frame."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        try:
            return "answered" if sock.recv(4) else "closed"
        except ConnectionResetError:
            return "closed"


def test_the_saved_frames_include_the_three_that_killed_the_broker() -> None:
    names = {path.name for path in REGRESSIONS.glob("*.hex")}
    assert {"crash-api8-offset-commit-v8.hex", "crash-api9-offset-fetch-v8.hex"} <= names
    assert "crash-api11-join-group-v7.hex" in names


@pytest.mark.parametrize("frame", load_regressions(REGRESSIONS), ids=lambda frame: frame[:4].hex())
def test_a_saved_frame_is_refused_and_the_broker_keeps_serving(broker: BrokerProcess, frame: bytes) -> None:
    before = _fingerprint(broker.data_dir)
    with WireClient(broker.address) as bystander:
        assert _send(broker.address, frame) in ("answered", "closed")
        assert broker.process is not None and broker.process.poll() is None
        # Another connection, open all along, is unaffected.
        response = bystander.request(18, 3, client_software_name="probe", client_software_version="1")
        assert response.error_code == ErrorCode.none
    assert _fingerprint(broker.data_dir) == before
    assert "Traceback" not in broker.log_path.read_text()


@pytest.mark.parametrize("limit", ["max_bytes", "partition_max_bytes"])
def test_a_fetch_with_negative_byte_limits_gets_one_batch(broker: BrokerProcess, limit: str) -> None:
    """Found by a campaign: a limit below -16 KiB reached os.pread as a negative length."""
    with WireClient(broker.address) as client:
        response = client.fetch({TOPIC: [0, 1]}, **{limit: -(1 << 30)})
    partitions = response.responses[0].partitions
    assert [partition.error_code for partition in partitions] == [ErrorCode.none] * 2
    assert any(partition.records for partition in partitions)
    assert broker.process is not None and broker.process.poll() is None


@pytest.mark.parametrize("kind", list(malformed_frames()))
def test_a_malformed_request_closes_its_connection_and_nothing_else(broker: BrokerProcess, kind: str) -> None:
    before = _fingerprint(broker.data_dir)
    with WireClient(broker.address) as bystander:
        assert _send(broker.address, malformed_frames()[kind]) == "closed"
        response = bystander.request(18, 3, client_software_name="probe", client_software_version="1")
        assert response.error_code == ErrorCode.none
    assert _fingerprint(broker.data_dir) == before
    assert "Traceback" not in broker.log_path.read_text()
