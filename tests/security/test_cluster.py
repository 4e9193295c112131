"""Three brokers on SASL_SSL, for clients and among themselves, with an authorizer, and the ACLs
and SCRAM credentials in ZooKeeper with Kafka's layout. What a client stores through one broker
is in ZooKeeper when the answer comes and holds on every broker; what an operator writes into
ZooKeeper as Kafka's tools do holds too. Producers with acks=all and consumers work, a follower
needs CLUSTER_ACTION to replicate, and a leader's failover keeps what was acknowledged. One
cluster for the module; the failover comes last."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
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
from kazoo.client import KazooClient

from onceflow.cluster.znodes import partition_state_path
from onceflow.cluster.zookeeper_server import ZooKeeperServer
from onceflow.security.scram import ScramCredential
from tests.conftest import FAST_JOINS, BrokerProcess, wait_until
from tests.security.certs import Certificates

BROKER_IDS = (1, 2, 3)
PLAIN_USERS = {"admin": "admin-secret", **{f"broker{i}": f"broker{i}-secret" for i in BROKER_IDS}}


class SecureBroker(BrokerProcess):
    """`onceflow broker --config F` with one SASL_SSL listener, for clients and brokers."""

    def __init__(self, data_dir: Path, broker_id: int, config: dict[str, str]) -> None:
        super().__init__(data_dir)
        self.broker_id = broker_id
        self.config = config

    def _start_on(self, port: int) -> SecureBroker:
        self.port = port
        config_file = self.data_dir.parent / f"broker-{self.broker_id}.properties"
        lines = {**self.config, "listeners": f"SASL_SSL://127.0.0.1:{self.port}"}
        config_file.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        command = [sys.executable, "-m", "onceflow.cli", "broker", "--data-dir", str(self.data_dir)]
        command += ["--config", str(config_file), "--broker-id", str(self.broker_id)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on SASL_SSL://" not in line:
            self.process.kill()
            raise RuntimeError(f"broker did not start: {line!r}")
        return self


@dataclass
class SecureCluster:
    zookeeper: ZooKeeperServer
    brokers: dict[int, SecureBroker]
    ca: Path
    _admins: dict[Any, AdminClient] = field(default_factory=dict)

    def live(self) -> dict[int, SecureBroker]:
        return {i: b for i, b in self.brokers.items() if b.process is not None and b.process.poll() is None}

    def client(
        self, user: str, password: str, mechanism: str = "PLAIN", only: int | None = None
    ) -> dict[str, str]:
        """librdkafka's settings for `user`, bootstrapped from every live broker or `only` one."""
        brokers = [self.brokers[only]] if only is not None else list(self.live().values())
        return {
            "bootstrap.servers": ",".join(broker.bootstrap_servers for broker in brokers),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(self.ca),
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
        }

    def admin(self, only: int | None = None) -> AdminClient:
        """The super user's admin client (kept: a client destroyed fails its futures)."""
        key = (only, tuple(self.live()))
        if key not in self._admins:
            self._admins[key] = AdminClient(self.client("admin", PLAIN_USERS["admin"], only=only))
        return self._admins[key]

    def zookeeper_client(self) -> KazooClient:
        client = KazooClient(hosts=self.zookeeper.connect_string)
        client.start(30)
        return client


def _jaas(broker_id: int) -> str:
    users = " ".join(f'user_{user}="{password}"' for user, password in PLAIN_USERS.items())
    return (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="broker{broker_id}" password="broker{broker_id}-secret" {users};'
    )


def _acl(
    principal: str, resource: ResourceType, name: str, operation: AclOperation, **kwargs: Any
) -> AclBinding:
    return AclBinding(
        resource,
        name,
        kwargs.get("pattern", ResourcePatternType.LITERAL),
        principal,
        "*",
        operation,
        kwargs.get("permission", AclPermissionType.ALLOW),
    )


def _done(futures: Any, timeout: float = 30) -> list[Any]:
    return [
        future.result(timeout=timeout)
        for future in (futures.values() if isinstance(futures, dict) else futures)
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    directory = tmp_path_factory.mktemp("secure-cluster")
    certificates = Certificates(directory)
    keystore = certificates.issue("broker", "localhost", server=True)
    with ZooKeeperServer() as zookeeper:
        brokers = {}
        for broker_id in BROKER_IDS:
            config = {
                **FAST_JOINS,
                "zookeeper.connect": zookeeper.connect_string,
                "zookeeper.session.timeout.ms": "2000",
                "default.replication.factor": "3",
                "replica.lag.time.max.ms": "1500",
                "inter.broker.listener.name": "SASL_SSL",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                "listener.name.sasl_ssl.plain.sasl.jaas.config": _jaas(broker_id),
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(certificates.ca),
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": "User:admin",
            }
            brokers[broker_id] = SecureBroker(directory / f"broker-{broker_id}", broker_id, config)
        try:
            with ThreadPoolExecutor(len(brokers)) as pool:
                list(pool.map(SecureBroker.start, brokers.values()))
            running = SecureCluster(zookeeper, brokers, certificates.ca)
            # The brokers replicate as User:brokerN, which needs CLUSTER_ACTION.
            _done(
                running.admin().create_acls(
                    [
                        _acl(
                            f"User:broker{i}",
                            ResourceType.BROKER,
                            "kafka-cluster",
                            AclOperation.CLUSTER_ACTION,
                        )
                        for i in BROKER_IDS
                    ]
                )
            )
            wait_until(
                lambda: len(running.admin().list_topics(timeout=10).brokers) == len(BROKER_IDS), timeout_s=60
            )
            yield running
        finally:
            for broker in brokers.values():
                if broker.process is not None and broker.process.poll() is None:
                    broker.kill()


def test_acls_and_credentials_are_in_zookeeper_with_kafkas_layout_before_the_answer_and_hold_on_every_broker(
    cluster: SecureCluster,
) -> None:
    user, password = f"carol-{uuid.uuid4().hex[:6]}", "carol-secret"
    topic = f"shared-{uuid.uuid4().hex[:6]}"
    # Control: before the credential exists, no broker lets carol in.
    for broker_id in BROKER_IDS:
        refused = AdminClient(cluster.client(user, password, "SCRAM-SHA-256", only=broker_id))
        with pytest.raises(KafkaException):
            refused.list_topics(timeout=3)
    _done(
        cluster.admin(only=1).alter_user_scram_credentials(
            [
                UserScramCredentialUpsertion(
                    user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password.encode()
                )
            ]
        )
    )
    acl = _acl(f"User:{user}", ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    _done(cluster.admin(only=1).create_acls([acl]))
    # In ZooKeeper as the answers came, in Kafka's layout (read here, not through a broker).
    zookeeper = cluster.zookeeper_client()
    try:
        stored = json.loads(zookeeper.get(f"/config/users/{user}")[0])
        assert stored["version"] == 1 and set(stored["config"]) == {"SCRAM-SHA-256"}
        credential = ScramCredential.decode(stored["config"]["SCRAM-SHA-256"])
        assert credential.iterations == 4096
        assert credential == ScramCredential.from_password("SCRAM-SHA-256", password, 4096, credential.salt)
        acls = json.loads(zookeeper.get(f"/kafka-acl/Topic/{topic}")[0])
        assert acls == {
            "version": 1,
            "acls": [
                {"principal": f"User:{user}", "permissionType": "Allow", "operation": "Describe", "host": "*"}
            ],
        }
    finally:
        zookeeper.stop()
        zookeeper.close()
    # Every broker lets carol in and shows her the ACLs' effect.
    _done(cluster.admin(only=2).create_topics([NewTopic(topic, 1, 3)]))
    for broker_id in BROKER_IDS:
        settings = cluster.client(user, password, "SCRAM-SHA-256", only=broker_id)

        def sees_topic(settings: dict[str, str] = settings) -> bool:
            described = AdminClient(settings).list_topics(topic, timeout=10).topics[topic]
            return described.error is None

        wait_until(sees_topic, timeout_s=30)


def test_what_an_operator_writes_into_zookeeper_holds_on_every_broker_and_a_bad_znode_is_ignored(
    cluster: SecureCluster,
) -> None:
    """As `kafka-configs.sh --zookeeper` and `kafka-acls.sh --authorizer-properties` write."""
    user, password = f"dave-{uuid.uuid4().hex[:6]}", "dave-secret"
    topic = f"zk-{uuid.uuid4().hex[:6]}"
    credential = ScramCredential.from_password("SCRAM-SHA-512", password, 4096)
    zookeeper = cluster.zookeeper_client()
    try:
        zookeeper.create("/config/users/broken", b"{not json", makepath=True)
        zookeeper.create(f"/kafka-acl/Topic/{topic}-broken", b'{"version":1,"acls":[{"principal":1}]}')
        zookeeper.create(
            f"/config/users/{user}",
            json.dumps({"version": 1, "config": {"SCRAM-SHA-512": credential.encode()}}).encode(),
        )
        zookeeper.create(
            f"/kafka-acl-extended/prefixed/Topic/{topic}",
            json.dumps(
                {
                    "version": 1,
                    "acls": [
                        {
                            "principal": f"User:{user}",
                            "permissionType": "Allow",
                            "operation": "Write",
                            "host": "*",
                        }
                    ],
                }
            ).encode(),
        )
    finally:
        zookeeper.stop()
        zookeeper.close()
    _done(cluster.admin().create_topics([NewTopic(f"{topic}-a", 1, 3), NewTopic(f"other-{topic}", 1, 3)]))
    for broker_id in BROKER_IDS:
        settings = cluster.client(user, password, "SCRAM-SHA-512", only=broker_id)

        def visible(settings: dict[str, str] = settings) -> set[str]:
            return set(AdminClient(settings).list_topics(timeout=10).topics)

        # The PREFIXED WRITE implies DESCRIBE of the topics it covers, and only those (control).
        wait_until(lambda: f"{topic}-a" in visible(), timeout_s=30)
        assert f"other-{topic}" not in visible()
    listed = (
        cluster.admin()
        .describe_acls(
            AclBindingFilter(
                ResourceType.ANY,
                None,
                ResourcePatternType.ANY,
                None,
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
        )
        .result(timeout=30)
    )
    assert any(
        binding.name == topic and binding.resource_pattern_type == ResourcePatternType.PREFIXED
        for binding in listed
    )
    assert not any(binding.name == f"{topic}-broken" for binding in listed)  # the bad znode, ignored


def _isr(cluster: SecureCluster, topic: str) -> list[int]:
    described = cluster.admin().list_topics(topic, timeout=10).topics[topic]
    return sorted(described.partitions[0].isrs)


def _produce(cluster: SecureCluster, topic: str, values: list[bytes]) -> None:
    producer = Producer(
        {**cluster.client("admin", PLAIN_USERS["admin"]), "acks": "all", "enable.idempotence": True}
    )
    delivered: list[Any] = []
    for value in values:
        producer.produce(topic, value, on_delivery=lambda error, _message: delivered.append(error))
    assert producer.flush(30) == 0
    assert delivered == [None] * len(values)


def _consume(cluster: SecureCluster, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            **cluster.client("admin", PLAIN_USERS["admin"]),
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        wait_until(lambda: _poll_into(consumer, values) >= count, timeout_s=60)
    finally:
        consumer.close()
    return values


def _poll_into(consumer: Consumer, values: list[bytes]) -> int:
    message = consumer.poll(0.5)
    if message is not None and message.error() is None:
        values.append(message.value())
    return len(values)


def test_a_follower_without_cluster_action_cannot_replicate_and_one_with_it_can(
    cluster: SecureCluster,
) -> None:
    for _attempt in range(3):
        denied, control = _topics_led_by_broker_1(cluster)
        epochs = _leader_epochs(cluster, denied, control)
        try:
            _deny_a_follower_then_allow_it(cluster, denied, control)
            return
        except (AssertionError, TimeoutError):
            # The checks hold only while broker 1 leads both partitions throughout. On a loaded
            # machine ZooKeeper may end the brokers' sessions and move leadership (a new leader
            # epoch): then start again on new topics; otherwise the failure stands.
            if _leader_epochs(cluster, denied, control) == epochs:
                raise
    pytest.fail("leadership moved during each of 3 attempts")


def _topics_led_by_broker_1(cluster: SecureCluster) -> tuple[str, str]:
    """Two new topics: one on brokers 1 and 3, one on 1 and 2, each with both in its ISR."""
    denied, control = f"denied-{uuid.uuid4().hex[:6]}", f"allowed-{uuid.uuid4().hex[:6]}"
    for name, replicas in ((denied, [1, 3]), (control, [1, 2])):
        topic = NewTopic(name, num_partitions=1, replica_assignment=[replicas])
        _done(cluster.admin().create_topics([topic]))
    wait_until(lambda: _isr(cluster, denied) == [1, 3] and _isr(cluster, control) == [1, 2], timeout_s=30)
    return denied, control


def _deny_a_follower_then_allow_it(cluster: SecureCluster, denied: str, control: str) -> None:
    admin = cluster.admin()
    deny = _acl(
        "User:broker3",
        ResourceType.BROKER,
        "kafka-cluster",
        AclOperation.CLUSTER_ACTION,
        permission=AclPermissionType.DENY,
    )
    _done(admin.create_acls([deny]))
    try:
        values = [f"v{i}".encode() for i in range(20)]
        for name in (denied, control):
            _produce(cluster, name, values)
        # Broker 3's fetches are refused: it falls out of the ISR and copies nothing; broker 2,
        # allowed, stays in and has every record.
        wait_until(lambda: _isr(cluster, denied) == [1], timeout_s=30)
        assert _isr(cluster, control) == [1, 2]
        assert _log_bytes(cluster, 3, denied) == 0
        assert _log_bytes(cluster, 1, denied) > 0
        wait_until(
            lambda: _log_bytes(cluster, 2, control) == _log_bytes(cluster, 1, control) > 0, timeout_s=30
        )
    finally:
        _done(admin.delete_acls([AclBindingFilter(*_fields(deny))]))
    # The DENY gone, broker 3 catches up and rejoins.
    wait_until(lambda: _isr(cluster, denied) == [1, 3], timeout_s=30)
    assert _log_bytes(cluster, 3, denied) == _log_bytes(cluster, 1, denied)


def _leader_epochs(cluster: SecureCluster, *topics: str) -> list[int]:
    """Each topic's partition 0 leader epoch, as ZooKeeper holds it (not asked of a broker)."""
    zookeeper = cluster.zookeeper_client()
    try:
        return [
            json.loads(zookeeper.get(partition_state_path(topic, 0))[0])["leader_epoch"] for topic in topics
        ]
    finally:
        zookeeper.stop()
        zookeeper.close()


def _fields(binding: AclBinding) -> tuple[Any, ...]:
    return (
        binding.restype,
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission_type,
    )


def _log_bytes(cluster: SecureCluster, broker_id: int, topic: str) -> int:
    return sum(
        path.stat().st_size for path in (cluster.brokers[broker_id].data_dir / f"{topic}-0").glob("*.log")
    )


def test_acks_all_over_sasl_ssl_survives_the_leaders_failover(cluster: SecureCluster) -> None:
    topic = f"failover-{uuid.uuid4().hex[:6]}"
    _done(cluster.admin().create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[2, 1, 3]])]))
    wait_until(lambda: _isr(cluster, topic) == [1, 2, 3], timeout_s=30)
    first = [f"before-{i}".encode() for i in range(50)]
    _produce(cluster, topic, first)
    leader = cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    assert leader == 2  # precondition: the broker killed leads
    # Read once while all three are live: the offsets topic (replication factor 3) exists, and
    # its partitions led by broker 2 fail over with the data's.
    assert sorted(_consume(cluster, topic, 50)) == sorted(first)
    cluster.brokers[2].kill()
    wait_until(
        lambda: cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions[0].leader in (1, 3),
        timeout_s=60,
    )
    second = [f"after-{i}".encode() for i in range(50)]
    _produce(cluster, topic, second)
    assert sorted(_consume(cluster, topic, 100)) == sorted(first + second)
    # The killed broker comes back, logs in again, and replicates what it missed.
    cluster.brokers[2].start()
    wait_until(lambda: _isr(cluster, topic) == [1, 2, 3], timeout_s=60)
