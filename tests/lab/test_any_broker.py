"""The lab against brokers it did not start: the proxy rewrites the broker addresses of Metadata
and FindCoordinator, so every client connection passes through it and the client-side faults (lost
acks included) reach a separately started onceflow broker and librdkafka's mock cluster."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from onceflow import EmbeddedBroker
from onceflow.faults.proxy import FIND_COORDINATOR, FaultPlan, FaultProxy
from onceflow.protocol.codec import decode_response, encode_request, request_type
from tests.conftest import FAST_JOINS, BrokerProcess


@pytest.fixture
def mock_cluster() -> Iterator[list[tuple[str, int]]]:
    """librdkafka's in-process mock cluster of three brokers, alive as long as its producer."""
    owner = Producer({"test.mock.num.brokers": 3, "log_level": 0})
    brokers = owner.list_topics(timeout=10).brokers.values()
    yield sorted((broker.host, broker.port) for broker in brokers)
    del owner


def _lab_run(bootstrap: str, guarantee: str, out: Path) -> dict[str, Any]:
    completed = subprocess.run(
        [
            sys.executable, "-m", "onceflow.cli", "lab", "run", "--bootstrap", bootstrap,
            "--guarantee", guarantee, "--faults", "lost-acks", "--messages", "150", "--seconds", "3",
            "--seed", "5", "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip
    assert out.exists(), completed.stderr[-3000:]
    [run] = json.loads(out.read_text())["runs"]
    return {"returncode": completed.returncode, **run}


@pytest.mark.timeout(120)
def test_every_connection_goes_through_a_proxy_port(mock_cluster: list[tuple[str, int]]) -> None:
    with FaultProxy(FaultPlan(), upstream=mock_cluster[0], rewrite_addresses=True) as proxy:
        config = {"bootstrap.servers": proxy.address, "log_level": 0}
        producer = Producer({**config, "transactional.id": "rewritten"})
        brokers = producer.list_topics("t", timeout=10).brokers.values()
        # The client knows the brokers only by the proxy's ports, one per broker.
        assert sorted(broker.port for broker in brokers) == sorted(proxy.broker_ports.values())
        assert sorted(proxy.broker_ports) == mock_cluster
        producer.init_transactions(30)  # FindCoordinator for the transaction coordinator
        producer.begin_transaction()
        partitions = len(producer.list_topics("t", timeout=10).topics["t"].partitions)
        for number in range(20):
            producer.produce("t", value=str(number), partition=number % partitions)
        producer.commit_transaction(30)
        consumer = Consumer({**config, "group.id": "g", "auto.offset.reset": "earliest"})
        consumer.subscribe(["t"])
        read: list[Any] = []
        deadline = time.monotonic() + 30
        while len(read) < 20 and time.monotonic() < deadline:
            read += [message for message in consumer.consume(20, timeout=0.2) if message.error() is None]
        consumer.close()
        assert len(read) == 20
        # Leaders and coordinators spread over the brokers: the clients used several proxy ports.
        used = {port for port, count in proxy.connections_by_port.items() if count}
        assert len(used - {proxy.port}) > 1, proxy.connections_by_port


def _find_coordinator(address: str, version: int) -> Any:
    """One FindCoordinator request over a raw socket, its response decoded."""
    body_type = request_type(FIND_COORDINATOR, version)
    header = body_type.__header_schema__(
        request_api_key=FIND_COORDINATOR, request_api_version=version, correlation_id=42, client_id="raw"
    )
    fields: dict[str, Any] = {"key_type": 0} if version >= 1 else {}  # 0: a group
    fields |= {"coordinator_keys": ("group",)} if version >= 4 else {"key": "group"}
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(encode_request(header, body_type(**fields)))
        stream = connection.makefile("rb")
        (length,) = struct.unpack(">i", stream.read(4))
        frame = stream.read(length)
    correlation_id, body = decode_response(FIND_COORDINATOR, version, frame)
    assert correlation_id == 42  # kept
    return body


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", [0, 3, 4])
def test_find_coordinator_names_the_proxy_in_both_forms(tmp_path: Path, version: int) -> None:
    with (
        EmbeddedBroker(tmp_path / "data", config=FAST_JOINS) as broker,
        FaultProxy(FaultPlan(), upstream=("127.0.0.1", broker.port), rewrite_addresses=True) as proxy,
    ):
        response = _find_coordinator(proxy.address, version)
        [coordinator] = response.coordinators if version >= 4 else [response]
        proxied = proxy.broker_ports[("127.0.0.1", broker.port)]
        assert (coordinator.host, coordinator.port) == ("127.0.0.1", proxied)
        assert coordinator.port != broker.port


@pytest.mark.timeout(150)
def test_lab_run_with_lost_acks_against_a_separate_broker(
    broker_process: BrokerProcess, tmp_path: Path
) -> None:
    run = _lab_run(broker_process.bootstrap_servers, "exactly-once", tmp_path / "lab.json")
    assert run["returncode"] == 0
    clean = {"lost": "clean", "duplicated": "clean", "aborted_reads": "clean"}
    assert run["verdicts"] == clean, run["anomalies"][:3]
    assert run["coverage"]["acks_lost"] > 0


@pytest.mark.timeout(150)
def test_lab_run_with_lost_acks_against_the_mock_cluster(
    mock_cluster: list[tuple[str, int]], tmp_path: Path
) -> None:
    bootstrap = ",".join(f"{host}:{port}" for host, port in mock_cluster)
    # The mock cluster has no working transactions (docs/compatibility.md): at-least-once there.
    run = _lab_run(bootstrap, "at-least-once", tmp_path / "lab.json")
    assert run["drained"] and run["lost"] == 0, run["anomalies"][:3]
    assert run["verdicts"]["lost"] == "clean"
    assert run["coverage"]["acks_lost"] > 0
