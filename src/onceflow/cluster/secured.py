"""What `onceflow cluster run --security sasl_ssl` makes under `DIR/security/` before the
brokers start: a CA and the brokers' certificate, two SCRAM users written into ZooKeeper as
Kafka's `kafka-configs.sh --zookeeper` writes them (`broker`, which the brokers log in to each
other as, and `admin`, for the operator; both super users), the brokers' settings (one
SASL_SSL listener each, for clients and brokers, and the authorizer), and the admin's client
properties, which `--command-config` and confluent-kafka take as they are. Passwords are made
new at each run, and the files holding them are readable by their owner only."""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from kazoo.client import KazooClient

from onceflow.cluster.security_znodes import encode_user_config, user_path, with_scram_credentials
from onceflow.security.certificates import make_certificates
from onceflow.security.jaas import SCRAM_MODULE
from onceflow.security.scram import HASHES, ScramCredential

LISTENER = "SASL_SSL"
MECHANISM = "SCRAM-SHA-512"
ADMIN, BROKER = "admin", "broker"


@dataclass(frozen=True)
class SecuredCluster:
    broker_config: Path  # `onceflow broker --config`, with `listeners` set per broker
    client_properties: Path  # the admin's

    @staticmethod
    def listeners(host: str, port: int) -> str:
        """A broker's `listeners` setting."""
        return f"listeners={LISTENER}://{host}:{port}"


def secure(directory: Path, zookeeper: str, timeout_s: float = 30.0) -> SecuredCluster:
    directory.mkdir(parents=True, exist_ok=True)
    ca, keystore = make_certificates(directory)
    passwords = {user: secrets.token_urlsafe(18) for user in (ADMIN, BROKER)}
    client = KazooClient(hosts=zookeeper, timeout=timeout_s)
    # kazoo warns of each attempt to connect while ZooKeeper settles; the launcher reports failures.
    kazoo_log = logging.getLogger("kazoo")
    level = kazoo_log.level
    kazoo_log.setLevel(logging.ERROR)
    try:
        client.start(timeout_s)
    finally:
        kazoo_log.setLevel(level)
    try:
        for user, password in passwords.items():
            credentials = {
                mechanism: ScramCredential.from_password(mechanism, password) for mechanism in HASHES
            }
            data = encode_user_config(with_scram_credentials({}, credentials))
            if client.exists(user_path(user)):
                client.set(user_path(user), data)
            else:
                client.create(user_path(user), data, makepath=True)
    finally:
        client.stop()
        client.close()
    jaas = f'{SCRAM_MODULE} required username="{BROKER}" password="{passwords[BROKER]}";'
    broker_config = directory / "broker.properties"
    _write_secret(
        broker_config,
        {
            "inter.broker.listener.name": LISTENER,
            "sasl.enabled.mechanisms": ",".join(HASHES),
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.{LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(ca),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{ADMIN};User:{BROKER}",
        },
    )
    client_properties = directory / "client.properties"
    _write_secret(
        client_properties,
        {
            "security.protocol": LISTENER,
            "sasl.mechanism": MECHANISM,
            "sasl.username": ADMIN,
            "sasl.password": passwords[ADMIN],
            "ssl.ca.location": str(ca),
        },
    )
    return SecuredCluster(broker_config, client_properties)


def _write_secret(path: Path, properties: dict[str, str]) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.writelines(f"{key}={value}\n" for key, value in properties.items())
