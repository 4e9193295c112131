"""KIP-368 with a real client: with `connections.max.reauth.ms`, librdkafka authenticates again
on the same connection before its session expires and goes on producing; control: a connection
that does not re-authenticate is closed at its first request after the session expired."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from onceflow import EmbeddedBroker
from onceflow.admin.client import METADATA, BrokerConnection
from onceflow.admin.errors import AdminError
from onceflow.admin.login import client_login
from tests.conftest import FAST_JOINS, wait_until

REAUTH_MS = 1500
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" user_admin="admin-secret";'
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    config = {
        **FAST_JOINS,
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "connections.max.reauth.ms": str(REAUTH_MS),
    }
    with EmbeddedBroker(tmp_path_factory.mktemp("reauth") / "data", config=config, metrics_port=0) as running:
        admin = AdminClient({**_login(running, "PLAIN", "admin", "admin-secret")})
        upsert = UserScramCredentialUpsertion(
            "sam", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"sam-secret"
        )
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        yield running


def _login(broker: EmbeddedBroker, mechanism: str, user: str, password: str) -> dict[str, str]:
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def _authentications(broker: EmbeddedBroker) -> float:
    text = urllib.request.urlopen(broker.metrics_url, timeout=10).read().decode()
    pattern = (
        r"^kafka_server_socket_server_metrics_successful_authentication_total"
        r'\{listener="SASL_PLAINTEXT"\} (\S+)$'
    )
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_librdkafka_authenticates_again_on_the_same_connection_and_keeps_producing(
    broker: EmbeddedBroker, mechanism: str
) -> None:
    user, password = ("sam", "sam-secret") if mechanism != "PLAIN" else ("admin", "admin-secret")
    stats: list[dict[str, object]] = []
    producer = Producer(
        {
            **_login(broker, mechanism, user, password),
            "acks": "all",
            "statistics.interval.ms": 500,
            "stats_cb": lambda text: stats.append(json.loads(text)),
        }
    )
    delivered: list[object] = []
    before = _authentications(broker)
    deadline = time.monotonic() + 3.5 * REAUTH_MS / 1000
    while time.monotonic() < deadline:
        producer.produce("reauth", b"x", on_delivery=lambda error, _message: delivered.append(error))
        producer.poll(0.1)
    assert producer.flush(30) == 0
    wait_until(lambda: len(stats) >= 2, timeout_s=10)
    producer.poll(1)
    assert delivered and all(error is None for error in delivered), delivered[:3]
    # One connection to the broker the whole time (librdkafka's count of them), and more
    # successful authentications than connections: the client authenticated again on it.
    brokers = [
        broker_stats
        for broker_stats in stats[-1]["brokers"].values()  # type: ignore[attr-defined]
        if broker_stats["nodeid"] >= 0
    ]
    assert [broker_stats["connects"] for broker_stats in brokers] == [1]
    assert _authentications(broker) - before >= 1 + 2  # its first authentication and two more


def test_a_connection_that_does_not_authenticate_again_is_closed_after_its_session(
    broker: EmbeddedBroker,
) -> None:
    login = client_login(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "sam",
            "sasl.password": "sam-secret",
        }
    )
    connection = BrokerConnection(broker.bootstrap_servers, 10, login)
    metadata = dict(
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    try:
        assert connection.call(METADATA, **metadata).brokers  # served within the session
        time.sleep(REAUTH_MS / 1000 + 0.5)  # past the session's end: nothing to wait on but time
        with pytest.raises(AdminError, match="lost the connection"):
            connection.call(METADATA, **metadata)
    finally:
        connection.close()
