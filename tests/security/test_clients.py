"""Real clients over TLS and SASL: confluent-kafka, kafka-python, aiokafka and kcat write over
SSL (with a client certificate), SASL_PLAINTEXT and SASL_SSL with PLAIN and both SCRAM mechanisms,
and a confluent-kafka consumer reads back what each wrote, over the same listener. A wrong
password, an unknown user, an expired client certificate and PLAINTEXT bytes to a TLS port each
fail the way the client reports them, and leave the broker serving the others. One broker and
one set of certificates for the module."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from onceflow import EmbeddedBroker
from tests.conftest import FAST_JOINS
from tests.security.certs import Certificates
from tests.wire import WireClient

PLAIN_JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
    'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";'
)
SCRAM_USERS = {"SCRAM-SHA-256": ("sam", "sam-secret"), "SCRAM-SHA-512": ("sue", "sue-secret")}
# (listener, mechanism): every way in the issue asks for.
WAYS = [
    ("SSL", None),
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_SSL", "SCRAM-SHA-512"),
    ("SASL_SSL", "PLAIN"),
]
CLIENTS = ["confluent", "kafka-python", "aiokafka", "kcat"]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    made = Certificates(tmp_path_factory.mktemp("certs"))
    made.issue("broker", "localhost", server=True)
    made.issue("client", "client")
    made.issue("expired", "expired", expired=True)
    return made


@pytest.fixture(scope="module")
def broker(certificates: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    directory = certificates.directory
    config = {
        **FAST_JOINS,
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "security.inter.broker.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(directory / "broker.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certificates.ca),
        "listener.name.ssl.ssl.client.auth": "required",
    }
    with EmbeddedBroker(tmp_path_factory.mktemp("secure") / "data", config=config) as running:
        admin = AdminClient(
            {
                "bootstrap.servers": running.bootstrap("SASL_PLAINTEXT"),
                **_sasl("PLAIN", "admin", "admin-secret"),
            }
        )
        futures = admin.alter_user_scram_credentials(
            [
                UserScramCredentialUpsertion(
                    user,
                    ScramCredentialInfo(getattr(ScramMechanism, mechanism.replace("-", "_")), 4096),
                    password.encode(),
                )
                for mechanism, (user, password) in SCRAM_USERS.items()
            ]
        )
        for future in futures.values():
            assert future.result(timeout=30) is None
        yield running


def _sasl(mechanism: str, user: str, password: str, protocol: str = "SASL_PLAINTEXT") -> dict[str, str]:
    return {
        "security.protocol": protocol,
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def _user(mechanism: str) -> tuple[str, str]:
    return ("alice", "alice-secret") if mechanism == "PLAIN" else SCRAM_USERS[mechanism]


def _librdkafka(
    broker: EmbeddedBroker, certificates: Certificates, listener: str, mechanism: str | None
) -> dict[str, str]:
    """librdkafka's settings (confluent-kafka and kcat) for one way in."""
    settings = {"bootstrap.servers": broker.bootstrap(listener), "security.protocol": listener}
    if mechanism is not None:
        user, password = _user(mechanism)
        settings.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
    if listener.endswith("SSL"):
        settings["ssl.ca.location"] = str(certificates.ca)
    if listener == "SSL":
        settings["ssl.certificate.location"] = str(certificates.directory / "client.crt")
        settings["ssl.key.location"] = str(certificates.directory / "client.key")
    return settings


def _python_settings(
    broker: EmbeddedBroker, certificates: Certificates, listener: str, mechanism: str | None
) -> dict[str, Any]:
    """kafka-python's and aiokafka's settings (the same names)."""
    settings: dict[str, Any] = {
        "bootstrap_servers": broker.bootstrap(listener),
        "security_protocol": listener,
    }
    if mechanism is not None:
        user, password = _user(mechanism)
        settings.update(sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password)
    return settings


def _ssl_files(certificates: Certificates, listener: str) -> dict[str, str | None]:
    if not listener.endswith("SSL"):
        return {}
    client = listener == "SSL"
    directory = certificates.directory
    return {
        "cafile": str(certificates.ca),
        "certfile": str(directory / "client.crt") if client else None,
        "keyfile": str(directory / "client.key") if client else None,
    }


def _write(
    client: str,
    broker: EmbeddedBroker,
    certificates: Certificates,
    listener: str,
    mechanism: str | None,
    topic: str,
    values: list[bytes],
) -> None:
    if client == "confluent":
        producer = Producer(_librdkafka(broker, certificates, listener, mechanism))
        for value in values:
            producer.produce(topic, value)
        assert producer.flush(30) == 0
    elif client == "kafka-python":
        from kafka import KafkaProducer

        files = _ssl_files(certificates, listener)
        ssl_settings = {f"ssl_{key}": value for key, value in files.items() if value} if files else {}
        kafka_producer = KafkaProducer(
            acks="all", **_python_settings(broker, certificates, listener, mechanism), **ssl_settings
        )
        for value in values:
            kafka_producer.send(topic, value).get(timeout=30)
        kafka_producer.close()
    elif client == "aiokafka":
        from aiokafka import AIOKafkaProducer
        from aiokafka.helpers import create_ssl_context

        files = _ssl_files(certificates, listener)

        async def write() -> None:
            extra: dict[str, Any] = {}
            if files:
                extra["ssl_context"] = create_ssl_context(
                    **{key: value for key, value in files.items() if value}
                )
            producer = AIOKafkaProducer(
                **_python_settings(broker, certificates, listener, mechanism), **extra
            )
            await producer.start()
            try:
                for value in values:
                    await producer.send_and_wait(topic, value)
            finally:
                await producer.stop()

        asyncio.run(write())
    else:
        settings = _librdkafka(broker, certificates, listener, mechanism)
        command = ["kcat", "-P", "-t", topic]
        for key, value in settings.items():
            command += ["-b", value] if key == "bootstrap.servers" else ["-X", f"{key}={value}"]
        subprocess.run(command, input=b"\n".join(values) + b"\n", check=True, timeout=60, capture_output=True)


def _read(
    broker: EmbeddedBroker,
    certificates: Certificates,
    listener: str,
    mechanism: str | None,
    topic: str,
    count: int,
) -> list[bytes]:
    consumer = Consumer(
        {
            **_librdkafka(broker, certificates, listener, mechanism),
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    read: list[bytes] = []
    try:
        for _ in range(300):
            if len(read) >= count:
                break
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                value = message.value()
                assert value is not None
                read.append(value)
    finally:
        consumer.close()
    return read


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    ("listener", "mechanism"), WAYS, ids=[f"{listener}-{mechanism or 'cert'}" for listener, mechanism in WAYS]
)
def test_a_client_writes_and_reads_over_each_secured_listener(
    broker: EmbeddedBroker, certificates: Certificates, client: str, listener: str, mechanism: str | None
) -> None:
    topic = f"{client}-{listener}-{mechanism or 'cert'}".lower()
    values = [f"{topic}-{index}".encode() for index in range(3)]
    _write(client, broker, certificates, listener, mechanism, topic, values)
    assert _read(broker, certificates, listener, mechanism, topic, 3) == values


def _auth_errors(settings: dict[str, str]) -> list[KafkaError]:
    errors: list[KafkaError] = []
    producer = Producer(
        {**settings, "error_cb": errors.append, "socket.timeout.ms": 5000, "message.timeout.ms": 4000}
    )
    producer.produce("refused", b"never")
    producer.flush(6)
    return errors


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_password_or_an_unknown_user_fails_alike_and_the_broker_serves_the_others(
    broker: EmbeddedBroker, certificates: Certificates, mechanism: str
) -> None:
    user, password = _user(mechanism)
    bootstrap = broker.bootstrap("SASL_PLAINTEXT")
    messages = []
    for who, secret in ((user, password + "x"), ("nobody", password)):
        errors = _auth_errors({"bootstrap.servers": bootstrap, **_sasl(mechanism, who, secret)})
        assert any(error.code() == KafkaError._AUTHENTICATION for error in errors), errors
        message = next(error.str() for error in errors if error.code() == KafkaError._AUTHENTICATION)
        messages.append(message.split(" (after ")[0])
    # No hint of which part was wrong: the same answer for a wrong password and an unknown user.
    assert messages[0].split(": ", 1)[1] == messages[1].split(": ", 1)[1]
    # The control: the right password gets in, and the broker serves it after the failures.
    _write(
        "confluent",
        broker,
        certificates,
        "SASL_PLAINTEXT",
        mechanism,
        f"after-failures-{mechanism.lower()}",
        [b"in"],
    )


def test_an_expired_client_certificate_and_plaintext_to_a_tls_port_are_refused(
    broker: EmbeddedBroker, certificates: Certificates
) -> None:
    settings = _librdkafka(broker, certificates, "SSL", None)
    expired = {
        **settings,
        "ssl.certificate.location": str(certificates.directory / "expired.crt"),
        "ssl.key.location": str(certificates.directory / "expired.key"),
    }
    errors = _auth_errors(expired)
    assert any(
        error.code()
        in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._AUTHENTICATION, KafkaError._ALL_BROKERS_DOWN)
        for error in errors
    ), errors
    plaintext = _auth_errors({"bootstrap.servers": broker.bootstrap("SSL"), "security.protocol": "PLAINTEXT"})
    assert plaintext, "a PLAINTEXT client of a TLS port got no error"
    with WireClient(broker.bootstrap("SSL")) as wire:
        wire.send_raw(wire.frame(18, 3, client_software_name="x", client_software_version="1")[1])
        assert wire.connection_closed()
    # The control: a valid certificate gets in, after both.
    _write("confluent", broker, certificates, "SSL", None, "after-tls-failures", [b"in"])


def test_a_request_before_authentication_closes_the_connection(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap("SASL_PLAINTEXT")) as wire:
        versions = wire.request(18, 3, client_software_name="x", client_software_version="1")
        assert versions.error_code == 0  # ApiVersions is allowed before authentication
        wire.send_raw(
            wire.frame(
                3, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
            )[1]
        )
        assert wire.connection_closed()
    # The control: the same Metadata after authenticating is answered.
    with WireClient(broker.bootstrap("SASL_PLAINTEXT")) as wire:
        assert wire.request(17, 1, mechanism="PLAIN").error_code == 0
        assert wire.request(36, 2, auth_bytes=b"\0alice\0alice-secret").error_code == 0
        assert wire.request(
            3, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        ).brokers


def test_sasl_handshake_v0_takes_unframed_tokens(broker: EmbeddedBroker) -> None:
    import struct

    with WireClient(broker.bootstrap("SASL_PLAINTEXT")) as wire:
        assert wire.request(17, 0, mechanism="PLAIN").error_code == 0
        token = b"\0alice\0alice-secret"
        wire.send_raw(struct.pack(">i", len(token)) + token)
        assert wire._recv_exactly(4) == b"\0\0\0\0"  # PLAIN's empty answer
        assert wire.request(
            3, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        ).brokers
    with WireClient(broker.bootstrap("SASL_PLAINTEXT")) as wire:  # the control: a wrong password
        assert wire.request(17, 0, mechanism="PLAIN").error_code == 0
        token = b"\0alice\0wrong"
        wire.send_raw(struct.pack(">i", len(token)) + token)
        assert wire.connection_closed()


def test_an_unsupported_mechanism_is_answered_with_the_enabled_ones(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap("SASL_PLAINTEXT")) as wire:
        answer = wire.request(17, 1, mechanism="GSSAPI")
        assert answer.error_code == 33
        assert sorted(answer.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def test_secrets_never_leave_the_broker(broker: EmbeddedBroker) -> None:
    """DescribeConfigs marks the JAAS config sensitive and sends no value."""
    admin = AdminClient(
        {"bootstrap.servers": broker.bootstrap("SASL_PLAINTEXT"), **_sasl("PLAIN", "admin", "admin-secret")}
    )
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.BROKER, "0")
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    jaas = configs["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    assert jaas.is_sensitive and jaas.value is None
    assert configs["sasl.enabled.mechanisms"].value == "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"  # the control


def test_the_listener_a_client_came_in_on_is_the_one_it_is_told_of(
    broker: EmbeddedBroker, certificates: Certificates
) -> None:
    for listener, mechanism in (("SASL_SSL", "PLAIN"), ("SASL_PLAINTEXT", "PLAIN"), ("SSL", None)):
        metadata = AdminClient(_librdkafka(broker, certificates, listener, mechanism)).list_topics(timeout=30)
        (node,) = metadata.brokers.values()
        assert f"{node.host}:{node.port}" == broker.bootstrap(listener)


def test_the_principal_of_a_client_certificate_is_its_subject(
    tmp_path: Path, certificates: Certificates
) -> None:
    """With an authorizer: the certificate's subject, as Kafka names it, is what ACLs name."""
    config = {
        "listeners": "SSL://127.0.0.1:0",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certificates.directory / "broker.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certificates.ca),
        "ssl.client.auth": "required",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:CN=client,O=onceflow",
    }
    with EmbeddedBroker(tmp_path / "data", config=config) as running:
        settings = _librdkafka(running, certificates, "SSL", None)
        _write("confluent", running, certificates, "SSL", None, "by-subject", [b"in"])
        # The control: another certificate of the same CA is no super user.
        other = certificates.issue("other", "other")
        errors: list[Any] = []
        producer = Producer(
            {
                **settings,
                "ssl.certificate.location": str(other).replace(".pem", ".crt"),
                "ssl.key.location": str(other).replace(".pem", ".key"),
                "message.timeout.ms": 5000,
            }
        )
        producer.produce("by-subject", b"no", on_delivery=lambda error, _: errors.append(error))
        producer.flush(10)
        assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
