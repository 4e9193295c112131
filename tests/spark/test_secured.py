"""The exactly-once Spark query (onceflow source to onceflow sink) against a broker that serves
SASL_SSL only, with an authorizer, as a SCRAM user granted only what the query needs: READ on
its input, WRITE on its output, CREATE and READ on the sink's progress topic, READ on the sink's
group and WRITE on its transactional ids (a PREFIXED ACL). Control: the same query as a user
without the transactional ids' ACL fails with Kafka's authorization error and writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from onceflow import EmbeddedBroker
from onceflow.spark.producing import DEFAULT_PROGRESS_TOPIC
from tests.conftest import FAST_JOINS
from tests.security.certs import Certificates
from tests.support import read_to_end, values

pytestmark = pytest.mark.spark

PREFIX = "secured-eo"
RECORDS = 200
ADMIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" user_admin="admin-secret";'
)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedBroker, Path]]:
    directory = tmp_path_factory.mktemp("secured-spark")
    certificates = Certificates(directory)
    keystore = certificates.issue("broker", "localhost", server=True)
    config = {
        **FAST_JOINS,
        "listeners": "SASL_SSL://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": ADMIN_JAAS,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certificates.ca),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    }
    with EmbeddedBroker(directory / "data", config=config) as broker:
        yield broker, certificates.ca


def _client(broker: EmbeddedBroker, ca: Path, mechanism: str, user: str, password: str) -> dict[str, str]:
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(ca),
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def _allow(
    principal: str, resource: ResourceType, name: str, operation: AclOperation, prefixed: bool = False
) -> AclBinding:
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    return AclBinding(resource, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)


def _prepare(
    broker: EmbeddedBroker, ca: Path, suffix: str, user: str, grant_transactions: bool
) -> dict[str, str]:
    """Topics in-<suffix> (with RECORDS records) and out-<suffix>, and `user` with the query's
    ACLs (without those on its transactional ids unless `grant_transactions`)."""
    admin_settings = _client(broker, ca, "PLAIN", "admin", "admin-secret")
    admin = AdminClient(admin_settings)
    for future in admin.create_topics(
        [NewTopic(f"in-{suffix}", 2, 1), NewTopic(f"out-{suffix}", 2, 1)]
    ).values():
        future.result(timeout=30)
    producer = Producer(admin_settings)
    for number in range(RECORDS):
        producer.produce(f"in-{suffix}", f"v{number}".encode(), partition=number % 2)
    assert producer.flush(30) == 0
    password = f"{user}-secret"
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    principal = f"User:{user}"
    acls = [
        _allow(principal, ResourceType.TOPIC, f"in-{suffix}", AclOperation.READ),
        _allow(principal, ResourceType.TOPIC, f"out-{suffix}", AclOperation.WRITE),
        _allow(principal, ResourceType.TOPIC, DEFAULT_PROGRESS_TOPIC, AclOperation.CREATE),
        _allow(principal, ResourceType.TOPIC, DEFAULT_PROGRESS_TOPIC, AclOperation.READ),
        _allow(principal, ResourceType.GROUP, f"{PREFIX}-{suffix}", AclOperation.READ),
    ]
    if grant_transactions:
        acls.append(
            _allow(
                principal,
                ResourceType.TRANSACTIONAL_ID,
                f"{PREFIX}-{suffix}",
                AclOperation.WRITE,
                prefixed=True,
            )
        )
    for future in admin.create_acls(acls).values():
        future.result(timeout=30)
    return _client(broker, ca, "SCRAM-SHA-512", user, password)


def _run_query(spark: SparkSession, settings: dict[str, str], suffix: str, checkpoint: Path) -> None:
    read = (
        spark.readStream.format("onceflow")
        .option("subscribe", f"in-{suffix}")
        .option("startingOffsets", "earliest")
    )
    for key, value in settings.items():
        read = read.option(f"kafka.{key}", value)
    write = read.load().select("value").writeStream.format("onceflow")
    for key, value in settings.items():
        write = write.option(f"kafka.{key}", value)
    query = (
        write.option("topic", f"out-{suffix}")
        .option("transactionalIdPrefix", f"{PREFIX}-{suffix}")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(240)
        error = query.exception()
        if error is not None:
            raise error
    finally:
        query.stop()


def test_the_exactly_once_query_runs_with_only_the_acls_it_needs(
    spark: SparkSession, secured: tuple[EmbeddedBroker, Path], tmp_path: Path
) -> None:
    broker, ca = secured
    settings = _prepare(broker, ca, "granted", "pipeline", grant_transactions=True)
    _run_query(spark, settings, "granted", tmp_path / "checkpoint")
    admin = _client(broker, ca, "PLAIN", "admin", "admin-secret")
    written = values(read_to_end(broker.bootstrap_servers, "out-granted", 2, "read_committed", config=admin))
    assert sorted(written) == sorted(f"v{number}" for number in range(RECORDS))


def test_without_the_transactional_ids_acl_the_query_fails_and_writes_nothing(
    spark: SparkSession, secured: tuple[EmbeddedBroker, Path], tmp_path: Path
) -> None:
    broker, ca = secured
    settings = _prepare(broker, ca, "refused", "intruder", grant_transactions=False)
    with pytest.raises(PySparkException, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
        _run_query(spark, settings, "refused", tmp_path / "checkpoint")
    admin = _client(broker, ca, "PLAIN", "admin", "admin-secret")
    assert (
        values(read_to_end(broker.bootstrap_servers, "out-refused", 2, "read_uncommitted", config=admin))
        == []
    )
