"""`onceflow users` and `onceflow acls` as an operator runs them, against a broker with a SASL
listener and an authorizer, logged in with `--command-config` as a super user; a real client
checks what each change lets in and keeps out."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from onceflow import EmbeddedBroker
from tests.conftest import FAST_JOINS, wait_until

pytestmark = pytest.mark.timeout(120)

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" user_admin="admin-secret";'
)
TOPIC, GROUP = "orders", "billing"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    config = {
        **FAST_JOINS,
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    }
    with EmbeddedBroker(tmp_path_factory.mktemp("admin-security") / "data", config=config) as running:
        producer = Producer({**_login("PLAIN", "admin", "admin-secret", running)})
        producer.produce(TOPIC, b"first")
        assert producer.flush(30) == 0
        yield running


def _login(mechanism: str, user: str, password: str, broker: EmbeddedBroker) -> dict[str, str]:
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def _properties(path: Path, settings: dict[str, str]) -> str:
    path.write_text(
        "".join(f"{key}={value}\n" for key, value in settings.items() if key != "bootstrap.servers")
    )
    return str(path)


def _onceflow(broker: EmbeddedBroker, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow.cli", *args, "--bootstrap", broker.bootstrap_servers],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def admin_config(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _properties(
        tmp_path_factory.mktemp("config") / "admin.properties",
        _login("PLAIN", "admin", "admin-secret", broker),
    )


def _can_log_in(broker: EmbeddedBroker, mechanism: str, user: str, password: str) -> bool:
    try:
        AdminClient(_login(mechanism, user, password, broker)).list_topics(timeout=3)
    except KafkaException:
        return False
    return True


def test_users_add_list_remove(broker: EmbeddedBroker, admin_config: str) -> None:
    assert not _can_log_in(broker, "SCRAM-SHA-512", "bob", "bob-secret")  # control: no such user yet
    added = _onceflow(broker, "users", "add", "bob", "--command-config", admin_config, stdin="bob-secret\n")
    assert added.returncode == 0, added.stderr
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        assert _can_log_in(broker, mechanism, "bob", "bob-secret")
    assert not _can_log_in(broker, "SCRAM-SHA-256", "bob", "wrong")  # control: the password counts
    listed = _onceflow(broker, "users", "list", "--json", "--command-config", admin_config)
    assert json.loads(listed.stdout) == [
        {"user": "bob", "mechanism": "SCRAM-SHA-256", "iterations": 4096},
        {"user": "bob", "mechanism": "SCRAM-SHA-512", "iterations": 4096},
    ]
    removed = _onceflow(
        broker, "users", "remove", "bob", "--mechanism", "SCRAM-SHA-512", "--command-config", admin_config
    )
    assert removed.returncode == 0, removed.stderr
    assert not _can_log_in(broker, "SCRAM-SHA-512", "bob", "bob-secret")
    assert _can_log_in(broker, "SCRAM-SHA-256", "bob", "bob-secret")
    table = _onceflow(broker, "users", "list", "bob", "--command-config", admin_config).stdout
    assert "SCRAM-SHA-256" in table and "SCRAM-SHA-512" not in table


def test_acls_add_list_remove_grant_and_take_back_what_a_consumer_needs(
    broker: EmbeddedBroker, admin_config: str
) -> None:
    assert (
        _onceflow(
            broker, "users", "add", "carol", "--password", "carol-secret", "--command-config", admin_config
        ).returncode
        == 0
    )
    carol = {**_login("SCRAM-SHA-256", "carol", "carol-secret", broker), "group.id": GROUP}
    assert not _reads(carol)  # control: logged in, but no ACL lets her read
    added = _onceflow(
        broker,
        "acls", "add", "--allow-principal", "User:carol", "--consumer", "--topic", TOPIC, "--group", GROUP,
        "--command-config", admin_config,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = json.loads(
        _onceflow(
            broker, "acls", "list", "--principal", "User:carol", "--json", "--command-config", admin_config
        ).stdout
    )
    assert sorted((row["resource_type"], row["name"], row["operation"]) for row in listed) == [
        ("Group", GROUP, "READ"),
        ("Topic", TOPIC, "DESCRIBE"),
        ("Topic", TOPIC, "READ"),
    ]
    assert _reads(carol)
    removed = _onceflow(
        broker,
        "acls",
        "remove",
        "--topic",
        TOPIC,
        "--allow-principal",
        "User:carol",
        "--command-config",
        admin_config,
    )
    assert removed.returncode == 0, removed.stderr
    assert "READ" in removed.stdout and "DESCRIBE" in removed.stdout
    assert not _reads(carol)


def _reads(settings: dict[str, str]) -> bool:
    """Whether a consumer with these settings gets the topic's first record: True with it,
    False with the authorization error the broker answers instead."""
    consumer = Consumer({**settings, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    outcome: list[bool] = []

    def polled() -> bool:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            outcome.append(message.value() == b"first")
        elif message is not None and "AUTHORIZATION_FAILED" in message.error().name():
            outcome.append(False)
        return bool(outcome)

    try:
        wait_until(polled, timeout_s=30)
    finally:
        consumer.close()
    return outcome[0]


def test_errors_are_one_line(broker: EmbeddedBroker, admin_config: str, tmp_path: Path) -> None:
    # No login: the SASL listener closes the connection.
    anonymous = _onceflow(broker, "acls", "list", "--timeout", "3")
    assert anonymous.returncode == 1 and len(anonymous.stderr.strip().splitlines()) == 1, anonymous.stderr
    # A user who may not change ACLs gets Kafka's authorization error, in one line.
    dan = _onceflow(
        broker, "users", "add", "dan", "--password", "dan-secret", "--command-config", admin_config
    )
    assert dan.returncode == 0, dan.stderr
    dan_config = _properties(
        tmp_path / "dan.properties", _login("SCRAM-SHA-256", "dan", "dan-secret", broker)
    )
    refused = _onceflow(
        broker, "acls", "add", "--allow-principal", "User:dan", "--operation", "All", "--cluster",
        "--command-config", dan_config,
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "AUTHORIZATION" in refused.stderr.upper(), refused.stderr
    # Control: the same command as the super user succeeds (then the ACL goes again).
    granted = _onceflow(
        broker, "acls", "add", "--allow-principal", "User:dan", "--operation", "All", "--cluster",
        "--command-config", admin_config,
    )  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    removed = _onceflow(broker, "acls", "remove", "--cluster", "--command-config", admin_config)
    assert removed.returncode == 0 and "User:dan" in removed.stdout, removed.stderr
    # Usage errors: exit 2, one line.
    for args in (
        ("acls", "add", "--allow-principal", "User:dan", "--operation", "Read"),
        ("acls", "add", "--topic", "t", "--operation", "Read"),
        ("acls", "add", "--topic", "t", "--allow-principal", "dan", "--operation", "Read"),
        ("acls", "add", "--topic", "t", "--allow-principal", "User:dan", "--operation", "Bogus"),
    ):
        result = _onceflow(broker, *args, "--command-config", admin_config)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
    unknown = _onceflow(broker, "users", "remove", "nobody", "--command-config", admin_config)
    assert unknown.returncode == 1 and "unknown user 'nobody'" in unknown.stderr


def test_the_tools_own_wire_client_logs_in_with_command_config(
    broker: EmbeddedBroker, admin_config: str
) -> None:
    """`topics list` and `txn list` speak the protocol themselves rather than through librdkafka."""
    for args in (("topics", "list"), ("txn", "list")):
        refused = _onceflow(broker, *args, "--timeout", "3")  # control: without a login
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        logged_in = _onceflow(broker, *args, "--command-config", admin_config)
        assert logged_in.returncode == 0, logged_in.stderr
    assert TOPIC in _onceflow(broker, "topics", "list", "--command-config", admin_config).stdout
