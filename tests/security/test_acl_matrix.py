"""The ACL matrix: for each API the broker serves, a principal without the permission gets
Kafka's authorization error and nothing changes (topics, log ends and starts, committed offsets,
configs: compared before and after, through a super user); granted the ACL Kafka asks for, the
same request succeeds. DENY beats ALLOW, PREFIXED patterns match, super users need no ACL, and
without an authorizer everything is served as before. One broker in the test process, raw
requests over a SASL/PLAIN connection."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from onceflow import EmbeddedBroker
from tests.conftest import FAST_JOINS
from tests.wire import WireClient, make_batch

JAAS = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin" user_bob="bob" '
    'user_carol="carol";'
)
TOPIC, GROUP, TXN = "data", "g", "txn"
# Kafka's codes.
TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED = 29, 30, 31, 53
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS = (
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
)
TOPIC_TYPE, GROUP_TYPE, CLUSTER_TYPE, TXN_TYPE = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
ALLOW, DENY = 3, 2


class SaslWire(WireClient):
    """A raw client logged in with SASL/PLAIN."""

    def __init__(self, address: str, user: str) -> None:
        super().__init__(address)
        assert self.request(17, 1, mechanism="PLAIN").error_code == 0
        assert self.request(36, 2, auth_bytes=f"\0{user}\0{user}".encode()).error_code == 0


def acl(
    resource_type: int,
    name: str,
    operation: int,
    permission: int = ALLOW,
    pattern: int = LITERAL,
    principal: str = "User:bob",
) -> dict[str, Any]:
    return {
        "resource_type": resource_type,
        "resource_name": name,
        "resource_pattern_type": pattern,
        "principal": principal,
        "host": "*",
        "operation": operation,
        "permission_type": permission,
    }


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    config = {
        **FAST_JOINS,
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "security.inter.broker.protocol": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "auto.create.topics.enable": "false",
    }
    with EmbeddedBroker(tmp_path_factory.mktemp("acls") / "data", config=config) as running:
        with SaslWire(running.bootstrap("SASL_PLAINTEXT"), "admin") as admin:
            assert admin.create_topic(TOPIC, 1) == 0
            produced = admin.request(
                0,
                9,
                transactional_id=None,
                acks=-1,
                timeout=10_000,
                topic_data=[
                    {
                        "name": TOPIC,
                        "partition_data": [{"index": 0, "records": make_batch([b"a", b"b", b"c"])}],
                    }
                ],
            )
            assert produced.responses[0].partition_responses[0].error_code == 0
            commit = admin.request(
                8,
                8,
                group_id=GROUP,
                generation_id_or_member_epoch=-1,
                member_id="",
                group_instance_id=None,
                topics=[
                    {
                        "name": TOPIC,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": 1,
                                "committed_leader_epoch": -1,
                                "committed_metadata": "",
                            }
                        ],
                    }
                ],
            )
            assert commit.topics[0].partitions[0].error_code == 0
            assert admin.init_producer_id(TXN).error_code == 0  # a transactional id to describe
        yield running


@pytest.fixture
def admin(broker: EmbeddedBroker) -> Iterator[SaslWire]:
    with SaslWire(broker.bootstrap("SASL_PLAINTEXT"), "admin") as wire:
        yield wire
        # Each case starts with bob holding no ACL.
        wire.request(
            31,
            3,
            filters=[
                {
                    "resource_type_filter": 1,
                    "resource_name_filter": None,
                    "pattern_type_filter": 1,
                    "principal_filter": "User:bob",
                    "host_filter": None,
                    "operation": 1,
                    "permission_type": 1,
                }
            ],
        )


def grant(admin: WireClient, *acls: dict[str, Any]) -> None:
    answer = admin.request(30, 3, creations=list(acls))
    assert [result.error_code for result in answer.results] == [0] * len(acls)


def snapshot(admin: WireClient) -> tuple[Any, ...]:
    """What a request may change, as a super user reads it."""
    metadata = admin.request(
        3, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    topics = sorted((str(topic.name), len(topic.partitions)) for topic in metadata.topics)
    ends = admin.list_offset(TOPIC, 0, -1), admin.list_offset(TOPIC, 0, -2)
    offsets = admin.request(9, 7, group_id=GROUP, topics=None, require_stable=False)
    committed = sorted(
        (topic.name, part.committed_offset) for topic in offsets.topics for part in topic.partitions
    )
    configs = admin.request(
        32,
        4,
        resources=[{"resource_type": 2, "resource_name": TOPIC, "configuration_keys": None}],
        include_synonyms=False,
        include_documentation=False,
    )
    own = sorted(
        (entry.name, entry.value) for entry in configs.results[0].configs if entry.config_source == 1
    )
    groups = sorted(group.group_id for group in admin.request(16, 4, states_filter=[]).groups)
    acls = admin.request(
        29,
        3,
        resource_type_filter=1,
        resource_name_filter=None,
        pattern_type_filter=1,
        principal_filter=None,
        host_filter=None,
        operation=1,
        permission_type=1,
    )
    return topics, ends, committed, own, groups, len(acls.resources)


@dataclass
class Case:
    api: str
    key: int
    version: int
    fields: Callable[[], dict[str, Any]]
    code: Callable[[Any], int]  # the answer's code for what the case asks
    denied_code: int
    grants: list[dict[str, Any]] = field(default_factory=list)


def _partition_code(path: str) -> Callable[[Any], int]:
    """The code at `topics[0].partitions[0].error_code`-like paths."""

    def code(answer: Any) -> int:
        value = answer
        for part in path.split("."):
            value = value[0] if part == "0" else getattr(value, part)
        return int(value)

    return code


CASES = [
    Case(
        "Produce",
        0,
        9,
        lambda: {
            "transactional_id": None,
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": make_batch([b"x"])}]}],
        },
        _partition_code("responses.0.partition_responses.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, WRITE)],
    ),
    Case(
        "Fetch",
        1,
        12,
        lambda: __import__("tests.wire", fromlist=["fetch_fields"]).fetch_fields({TOPIC: [0]}, 12),
        _partition_code("responses.0.partitions.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, READ)],
    ),
    Case(
        "ListOffsets",
        2,
        7,
        lambda: {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
        },
        _partition_code("topics.0.partitions.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, DESCRIBE)],
    ),
    Case(
        "Metadata",
        3,
        12,
        lambda: {
            "topics": [{"name": TOPIC, "topic_id": None}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
        _partition_code("topics.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, READ)],
    ),  # READ implies DESCRIBE
    Case(
        "OffsetCommit",
        8,
        8,
        lambda: {
            "group_id": GROUP,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 2,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        },
        _partition_code("topics.0.partitions.0.error_code"),
        GROUP_DENIED,
        [acl(GROUP_TYPE, GROUP, READ), acl(TOPIC_TYPE, TOPIC, READ)],
    ),
    Case(
        "OffsetFetch",
        9,
        7,
        lambda: {
            "group_id": GROUP,
            "topics": [{"name": TOPIC, "partition_indexes": [0]}],
            "require_stable": False,
        },
        _partition_code("error_code"),
        GROUP_DENIED,
        [acl(GROUP_TYPE, GROUP, DESCRIBE), acl(TOPIC_TYPE, TOPIC, DESCRIBE)],
    ),
    Case(
        "FindCoordinator",
        10,
        3,
        lambda: {"key": GROUP, "key_type": 0},
        _partition_code("error_code"),
        GROUP_DENIED,
        [acl(GROUP_TYPE, GROUP, DESCRIBE)],
    ),
    Case(
        "DescribeGroups",
        15,
        5,
        lambda: {"groups": [GROUP], "include_authorized_operations": False},
        _partition_code("groups.0.error_code"),
        GROUP_DENIED,
        [acl(GROUP_TYPE, GROUP, DESCRIBE)],
    ),
    Case(
        "CreateTopics",
        19,
        7,
        lambda: {
            "topics": [
                {
                    "name": "made",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout": 10_000,
            "validate_only": False,
        },
        _partition_code("topics.0.error_code"),
        TOPIC_DENIED,
        [acl(CLUSTER_TYPE, "kafka-cluster", CREATE)],
    ),
    Case(
        "CreatePartitions",
        37,
        3,
        lambda: {
            "topics": [{"name": TOPIC, "count": 2, "assignments": None}],
            "timeout": 10_000,
            "validate_only": True,
        },
        _partition_code("results.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, ALTER)],
    ),
    Case(
        "DeleteRecords",
        21,
        2,
        lambda: {
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 1}]}],
            "timeout": 10_000,
        },
        _partition_code("topics.0.partitions.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, DELETE)],
    ),
    Case(
        "InitProducerId (transactional)",
        22,
        4,
        lambda: {
            "transactional_id": TXN,
            "transaction_timeout": 60_000,
            "producer_id": -1,
            "producer_epoch": -1,
        },
        _partition_code("error_code"),
        TXN_DENIED,
        [acl(TXN_TYPE, TXN, WRITE)],
    ),
    Case(
        "InitProducerId (idempotent)",
        22,
        4,
        lambda: {
            "transactional_id": None,
            "transaction_timeout": 60_000,
            "producer_id": -1,
            "producer_epoch": -1,
        },
        _partition_code("error_code"),
        CLUSTER_DENIED,
        [acl(TOPIC_TYPE, "any", WRITE)],
    ),
    Case(
        "WriteTxnMarkers",
        27,
        1,
        lambda: {
            "markers": [
                {
                    "producer_id": 999,
                    "producer_epoch": 0,
                    "transaction_result": False,
                    "topics": [{"name": TOPIC, "partition_indexes": [0]}],
                    "coordinator_epoch": 0,
                }
            ]
        },
        _partition_code("markers.0.topics.0.partitions.0.error_code"),
        CLUSTER_DENIED,
        [acl(CLUSTER_TYPE, "kafka-cluster", CLUSTER_ACTION)],
    ),
    Case(
        "DescribeConfigs",
        32,
        4,
        lambda: {
            "resources": [{"resource_type": 2, "resource_name": TOPIC, "configuration_keys": None}],
            "include_synonyms": False,
            "include_documentation": False,
        },
        _partition_code("results.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, ALTER_CONFIGS)],
    ),  # implies DESCRIBE_CONFIGS
    Case(
        "IncrementalAlterConfigs",
        44,
        1,
        lambda: {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": TOPIC,
                    "configs": [{"name": "retention.ms", "config_operation": 0, "value": "123456"}],
                }
            ],
            "validate_only": False,
        },
        _partition_code("responses.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, ALTER_CONFIGS)],
    ),
    Case(
        "DescribeCluster",
        60,
        1,
        lambda: {"include_cluster_authorized_operations": False, "endpoint_type": 1},
        _partition_code("error_code"),
        CLUSTER_DENIED,
        [acl(CLUSTER_TYPE, "kafka-cluster", DESCRIBE)],
    ),
    Case(
        "DescribeLogDirs",
        35,
        4,
        lambda: {"topics": None},
        _partition_code("error_code"),
        CLUSTER_DENIED,
        [acl(CLUSTER_TYPE, "kafka-cluster", DESCRIBE)],
    ),
    Case(
        "DescribeProducers",
        61,
        0,
        lambda: {"topics": [{"name": TOPIC, "partition_indexes": [0]}]},
        _partition_code("topics.0.partitions.0.error_code"),
        TOPIC_DENIED,
        [acl(TOPIC_TYPE, TOPIC, READ)],
    ),
    Case(
        "CreateAcls",
        30,
        3,
        lambda: {"creations": [acl(TOPIC_TYPE, "other", READ, principal="User:carol")]},
        _partition_code("results.0.error_code"),
        CLUSTER_DENIED,
        [acl(CLUSTER_TYPE, "kafka-cluster", ALTER)],
    ),
    Case(
        "DescribeAcls",
        29,
        3,
        lambda: {
            "resource_type_filter": 1,
            "resource_name_filter": None,
            "pattern_type_filter": 1,
            "principal_filter": None,
            "host_filter": None,
            "operation": 1,
            "permission_type": 1,
        },
        _partition_code("error_code"),
        CLUSTER_DENIED,
        [acl(CLUSTER_TYPE, "kafka-cluster", DESCRIBE)],
    ),
    Case(
        "AlterUserScramCredentials",
        51,
        0,
        lambda: {
            "deletions": [],
            "upsertions": [
                {
                    "name": "dave",
                    "mechanism": 1,
                    "iterations": 4096,
                    "salt": b"salt",
                    "salted_password": b"x" * 32,
                }
            ],
        },
        _partition_code("results.0.error_code"),
        CLUSTER_DENIED,
        [acl(CLUSTER_TYPE, "kafka-cluster", ALTER)],
    ),
    Case(
        "DeleteGroups",
        42,
        2,
        lambda: {"groups_names": ["empty-group"]},
        _partition_code("results.0.error_code"),
        GROUP_DENIED,
        [acl(GROUP_TYPE, "empty-group", DELETE)],
    ),
    Case(
        "JoinGroup",
        11,
        9,
        lambda: {
            "group_id": "joiners",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
            "reason": None,
        },
        _partition_code("error_code"),
        GROUP_DENIED,
        [acl(GROUP_TYPE, "joiners", READ)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.api for case in CASES])
def test_denied_without_the_acl_changes_nothing_and_allowed_with_it(
    broker: EmbeddedBroker, admin: SaslWire, case: Case
) -> None:
    before = snapshot(admin)
    with SaslWire(broker.bootstrap("SASL_PLAINTEXT"), "bob") as bob:
        answer = bob.request(case.key, case.version, **case.fields())
        assert case.code(answer) == case.denied_code, answer
        assert snapshot(admin) == before, f"{case.api} changed something while denied"
        grant(admin, *case.grants)
        answer = bob.request(case.key, case.version, **case.fields())
        code = case.code(answer)
        # Allowed: the request reached its handler (which may have its own say, e.g. the
        # unknown producer of WriteTxnMarkers, or a group with no member to join as).
        assert code not in (TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED), answer


def test_every_api_but_apiversions_and_sasl_has_a_rule() -> None:
    from onceflow.apis.authorization import unchecked_apis

    assert unchecked_apis() == [17, 18, 36]


def test_deny_beats_allow_prefixed_patterns_and_super_users(broker: EmbeddedBroker, admin: SaslWire) -> None:
    fields = CASES[0].fields  # Produce
    with SaslWire(broker.bootstrap("SASL_PLAINTEXT"), "bob") as bob:
        grant(admin, acl(TOPIC_TYPE, "da", WRITE, pattern=PREFIXED))
        assert CASES[0].code(bob.request(0, 9, **fields())) == 0  # a PREFIXED ALLOW covers "data"
        grant(admin, acl(TOPIC_TYPE, "*", WRITE, permission=DENY))
        assert CASES[0].code(bob.request(0, 9, **fields())) == TOPIC_DENIED  # DENY (on every topic) wins
    with SaslWire(broker.bootstrap("SASL_PLAINTEXT"), "admin") as super_user:
        assert CASES[0].code(super_user.request(0, 9, **fields())) == 0  # no ACL binds a super user


def test_metadata_lists_only_topics_the_principal_may_describe(
    broker: EmbeddedBroker, admin: SaslWire
) -> None:
    every = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": True}
    with SaslWire(broker.bootstrap("SASL_PLAINTEXT"), "bob") as bob:
        assert bob.request(3, 12, **every).topics == ()
        grant(admin, acl(TOPIC_TYPE, TOPIC, READ))
        (topic,) = bob.request(3, 12, **every).topics
        assert topic.name == TOPIC
        assert topic.topic_authorized_operations == (1 << READ) | (1 << DESCRIBE)
    assert TOPIC in {topic.name for topic in admin.request(3, 12, **every).topics}  # the control


def test_acls_outlive_a_restart(tmp_path: Any) -> None:
    config = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    }
    broker = EmbeddedBroker(tmp_path / "data", config=config)
    with broker, SaslWire(broker.bootstrap("SASL_PLAINTEXT"), "admin") as admin:
        grant(admin, acl(TOPIC_TYPE, "kept", READ))
        upsert = {
            "name": "dave",
            "mechanism": 1,
            "iterations": 4096,
            "salt": b"salt",
            "salted_password": b"x" * 32,
        }
        assert admin.request(51, 0, deletions=[], upsertions=[upsert]).results[0].error_code == 0
    with broker, SaslWire(broker.bootstrap("SASL_PLAINTEXT"), "admin") as admin:
        found = admin.request(
            29,
            3,
            resource_type_filter=1,
            resource_name_filter=None,
            pattern_type_filter=1,
            principal_filter=None,
            host_filter=None,
            operation=1,
            permission_type=1,
        )
        assert [resource.resource_name for resource in found.resources] == ["kept"]
        users = admin.request(50, 0, users=None).results
        assert [(user.user, user.credential_infos[0].iterations) for user in users] == [("dave", 4096)]
