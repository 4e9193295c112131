"""What each API needs the principal to be allowed, checked before its handler runs, after
Kafka's KafkaApis with an authorizer (none configured: nothing here runs).

Every API has one rule in RULES. A rule names what the whole request needs (a transactional id,
a group, the cluster), and what each entry of one of its lists needs (a topic, a group, a config
resource). A request short of a whole-request permission is answered with that permission's
error (TOPIC_, GROUP_, CLUSTER_ or TRANSACTIONAL_ID_AUTHORIZATION_FAILED) for all of it, and its
handler never runs. Entries denied are taken out of the request before the handler sees it, and
answered with their error beside what the handler answers for the rest; so nothing a denied
request names is read or changed. Where Kafka filters instead (Metadata, ListGroups,
ListTransactions, listing every topic), the answer is filtered, and authorized-operations
fields carry what the principal may do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.apis.replies import map_reply
from onceflow.protocol.build import build_filled
from onceflow.protocol.codec import response_type
from onceflow.security.acls import CLUSTER_NAME, Operation, ResourceType

Handle = Callable[[Request], Any]
# A resource an entry or a request names: its type and name (None: nothing to check).
Resource = tuple[ResourceType, str] | None

ERRORS = {
    ResourceType.TOPIC: ErrorCode.topic_authorization_failed,
    ResourceType.GROUP: ErrorCode.group_authorization_failed,
    ResourceType.CLUSTER: ErrorCode.cluster_authorization_failed,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
}
_READ, _WRITE, _CREATE, _DELETE, _ALTER, _DESCRIBE = (
    Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER, Operation.DESCRIBE,
)  # fmt: skip
_CLUSTER = (ResourceType.CLUSTER, CLUSTER_NAME)


def allowed(request: Request, operation: Operation, resource: tuple[ResourceType, str]) -> bool:
    authorizer = request.broker.authorizer
    assert authorizer is not None
    session = request.session
    return authorizer.authorize(session.principal, session.host, operation, *resource)


def _topic(name: Any) -> Resource:
    return None if name is None else (ResourceType.TOPIC, str(name))


def _group(name: Any) -> Resource:
    return None if name is None else (ResourceType.GROUP, str(name))


def _transactional_id(name: Any) -> Resource:
    return None if name is None else (ResourceType.TRANSACTIONAL_ID, str(name))


@dataclass(frozen=True)
class Need:
    """A permission the whole request needs; `resource` None: not this request."""

    operation: Operation
    resource: Callable[[Request], Resource]
    error: ErrorCode | None = None  # else the resource type's


@dataclass(frozen=True)
class Entries:
    """A permission each entry of the request's list `field` needs; denied entries are answered,
    in the answer's list `answer_field`, with what `answer` makes of them."""

    field: str
    operation: Operation
    resource: Callable[[Request, Any], Resource]
    answer_field: str
    answer: Callable[[Request, Any, ErrorCode], dict[str, Any]]
    # Also allowed by the operation on the cluster (CreateTopics: CREATE on the cluster).
    or_cluster: bool = False
    # Any entry denied fails the rest (OPERATION_NOT_ATTEMPTED) and the handler does not run.
    all_or_nothing: bool = False


@dataclass(frozen=True)
class Rule:
    needs: tuple[Need, ...] = ()
    entries: Entries | None = None
    top_level: bool = False  # a whole-request denial sets the answer's error_code
    # For a whole-request denial: the answer's values, when neither of the above says them.
    denied: Callable[[Request, ErrorCode], dict[str, Any]] | None = None
    custom: Callable[[Request, Handle], Any] | None = None


def authorized(request: Request, handle: Handle) -> Any:
    """The answer to `request` as its principal may have it."""
    rule = RULES.get(request.api_key)
    if rule is None:  # ApiVersions and SASL: before and beside authorization
        return handle(request)
    if rule.custom is not None:
        return rule.custom(request, handle)
    for need in rule.needs:
        resource = need.resource(request)
        if resource is not None and not allowed(request, need.operation, resource):
            return _denied(request, rule, need.error or ERRORS[resource[0]])
    if rule.entries is None:
        return handle(request)
    return _by_entry(request, handle, rule.entries)


def _denied(request: Request, rule: Rule, code: ErrorCode) -> Any:
    if rule.denied is not None:
        values = rule.denied(request, code)
    elif rule.entries is not None:
        entries = getattr(request.body, rule.entries.field) or ()
        values = {rule.entries.answer_field: [rule.entries.answer(request, entry, code) for entry in entries]}
    else:
        values = {}
    if rule.top_level or (rule.entries is None and rule.denied is None):
        values["error_code"] = code
    return _answer(request, values)


def _answer(request: Request, values: dict[str, Any]) -> Any:
    if request.api_key == 0 and request.body.acks == 0:
        return None  # Produce with acks=0 has no answer
    return build_filled(response_type(request.api_key, request.api_version), values)


def _entry_allowed(request: Request, entries: Entries, entry: Any) -> ErrorCode | None:
    """None when the entry may go to the handler, else its error."""
    resource = entries.resource(request, entry)
    if resource is None or allowed(request, entries.operation, resource):
        return None
    if entries.or_cluster and allowed(request, entries.operation, _CLUSTER):
        return None
    return ERRORS[resource[0]]


def _by_entry(request: Request, handle: Handle, entries: Entries) -> Any:
    listed = getattr(request.body, entries.field)
    if not listed:
        return handle(request)
    kept, refused = [], []
    for entry in listed:
        code = _entry_allowed(request, entries, entry)
        if code is None:
            kept.append(entry)
        else:
            refused.append(entries.answer(request, entry, code))
    if not refused:
        return handle(request)
    if entries.all_or_nothing:
        not_attempted = [entries.answer(request, entry, ErrorCode.operation_not_attempted) for entry in kept]
        return _answer(request, {entries.answer_field: refused + not_attempted})
    if not kept:
        return _answer(request, {entries.answer_field: refused})
    narrowed = dataclasses.replace(
        request, body=dataclasses.replace(request.body, **{entries.field: tuple(kept)})
    )
    return map_reply(handle(narrowed), lambda answer: _with(answer, entries.answer_field, refused))


def _with(answer: Any, field: str, refused: list[dict[str, Any]]) -> Any:
    """The handler's answer with the refused entries' answers added to its list `field`."""
    made = build_filled(type(answer), {field: refused})
    return dataclasses.replace(answer, **{field: (*getattr(answer, field), *getattr(made, field))})


# -- the entries' answers ------------------------------------------------------------------------
def _partitions(
    name_field: str,
    partitions_field: str,
    index_field: str,
    answer_name: str,
    answer_partitions: str,
    answer_index: str,
    code_field: str = "error_code",
    topic_id: bool = False,
) -> Callable[[Request, Any, ErrorCode], dict[str, Any]]:
    """A topic's answer with every partition the request named given `code`."""

    def answer(request: Request, topic: Any, code: ErrorCode) -> dict[str, Any]:
        indexes = [
            index if isinstance(index, int) else getattr(index, index_field)
            for index in getattr(topic, partitions_field)
        ]
        values = {
            answer_name: getattr(topic, name_field, None),
            answer_partitions: [{answer_index: index, code_field: code} for index in indexes],
        }
        if topic_id:
            values["topic_id"] = getattr(topic, "topic_id", None)
        return values

    return answer


def _named(
    name_field: str, answer_name: str, **extra: Any
) -> Callable[[Request, Any, ErrorCode], dict[str, Any]]:
    """An answer naming the entry (an object's field, or the entry itself when it is a name)."""

    def answer(request: Request, entry: Any, code: ErrorCode) -> dict[str, Any]:
        name = entry if isinstance(entry, str) else getattr(entry, name_field)
        return {answer_name: name, "error_code": code, **extra}

    return answer


def _topic_of(request: Request, topic: Any, name_field: str = "name") -> Resource:
    """A topic entry's resource: by name, or by its id (KIP-516) when the version uses ids; an
    unknown id is the handler's to answer (UNKNOWN_TOPIC_ID), and tells nothing."""
    from onceflow.apis.common import topic_name

    name = getattr(topic, name_field, None)
    topic_id = getattr(topic, "topic_id", None)
    if topic_id is not None and not name:
        return _topic(topic_name(request, None, topic_id, 0))
    return _topic(name)


def _config_resource(request: Request, resource: Any) -> Resource:
    if resource.resource_type == 2:  # TOPIC
        return _topic(resource.resource_name)
    if resource.resource_type == 4:  # BROKER: the cluster's configs
        return _CLUSTER
    return None


def _config_answer(request: Request, resource: Any, code: ErrorCode) -> dict[str, Any]:
    return {
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
        "error_code": code,
    }


def _replica_id(request: Request) -> int:
    body = request.body
    state = getattr(body, "replica_state", None)
    if state is not None and request.api_key == 1 and request.api_version >= 15:
        return int(state.replica_id)
    return int(getattr(body, "replica_id", -1))


# -- the custom rules ----------------------------------------------------------------------------
def _fetch(request: Request, handle: Handle) -> Any:
    entries = Entries(
        "topics",
        _READ,
        lambda request, topic: _topic_of(request, topic, "topic"),
        "responses",
        _partitions(
            "topic", "partitions", "partition", "topic", "partitions", "partition_index", topic_id=True
        ),
    )
    if _replica_id(request) >= 0:  # a follower
        if allowed(request, Operation.CLUSTER_ACTION, _CLUSTER):
            return handle(request)
        return _denied(request, Rule(entries=entries), ErrorCode.topic_authorization_failed)
    return _by_entry(request, handle, entries)


def _offset_for_leader_epoch(request: Request, handle: Handle) -> Any:
    entries = Entries(
        "topics",
        _DESCRIBE,
        lambda request, topic: _topic(topic.topic),
        "topics",
        _partitions("topic", "partitions", "partition", "topic", "partitions", "partition"),
    )
    if _replica_id(request) >= 0:
        if allowed(request, Operation.CLUSTER_ACTION, _CLUSTER):
            return handle(request)
        return _denied(request, Rule(entries=entries), ErrorCode.cluster_authorization_failed)
    return _by_entry(request, handle, entries)


def _init_producer_id(request: Request, handle: Handle) -> Any:
    transactional_id = request.body.transactional_id
    if transactional_id is not None:
        if allowed(request, _WRITE, (ResourceType.TRANSACTIONAL_ID, transactional_id)):
            return handle(request)
        return _answer(request, {"error_code": ErrorCode.transactional_id_authorization_failed})
    authorizer = request.broker.authorizer
    assert authorizer is not None
    session = request.session
    if allowed(request, Operation.IDEMPOTENT_WRITE, _CLUSTER) or authorizer.allowed_somewhere(
        session.principal, session.host, _WRITE, ResourceType.TOPIC
    ):
        return handle(request)
    return _answer(request, {"error_code": ErrorCode.cluster_authorization_failed})


def _find_coordinator(request: Request, handle: Handle) -> Any:
    body = request.body
    as_resource = _transactional_id if getattr(body, "key_type", 0) == 1 else _group
    if request.api_version < 4:
        resource = as_resource(body.key)
        if resource is None or allowed(request, _DESCRIBE, resource):
            return handle(request)
        return _answer(request, {"error_code": ERRORS[resource[0]], "node_id": -1, "port": -1})
    entries = Entries(
        "coordinator_keys",
        _DESCRIBE,
        lambda request, key: as_resource(key),
        "coordinators",
        lambda request, key, code: {"key": key, "error_code": code, "node_id": -1, "port": -1},
    )
    return _by_entry(request, handle, entries)


def _add_partitions_to_txn(request: Request, handle: Handle) -> Any:
    if request.api_version >= 4:  # KIP-890's form, between brokers
        if allowed(request, Operation.CLUSTER_ACTION, _CLUSTER):
            return handle(request)
        return _answer(request, {"error_code": ErrorCode.cluster_authorization_failed})
    rule = Rule(
        needs=(Need(_WRITE, lambda request: _transactional_id(request.body.v3_and_below_transactional_id)),),
        entries=Entries(
            "v3_and_below_topics",
            _WRITE,
            lambda request, topic: _topic(topic.name),
            "results_by_topic_v3_and_below",
            _partitions(
                "name",
                "partitions",
                "",
                "name",
                "results_by_partition",
                "partition_index",
                "partition_error_code",
            ),
            all_or_nothing=True,
        ),
    )
    return authorized_by(request, handle, rule)


def authorized_by(request: Request, handle: Handle, rule: Rule) -> Any:
    for need in rule.needs:
        resource = need.resource(request)
        if resource is not None and not allowed(request, need.operation, resource):
            return _denied(request, rule, need.error or ERRORS[resource[0]])
    return handle(request) if rule.entries is None else _by_entry(request, handle, rule.entries)


def _offset_fetch(request: Request, handle: Handle) -> Any:
    if request.api_version < 8:
        group = request.body.group_id
        if not allowed(request, _DESCRIBE, (ResourceType.GROUP, group)):
            return _answer(request, {"error_code": ErrorCode.group_authorization_failed})
        topics = request.body.topics
        if topics is None:
            return map_reply(handle(request), lambda answer: _filter(request, answer, "topics", _topic_named))
        entries = Entries(
            "topics",
            _DESCRIBE,
            lambda request, topic: _topic(topic.name),
            "topics",
            _partitions("name", "partition_indexes", "", "name", "partitions", "partition_index"),
        )
        return _by_entry(request, handle, entries)
    groups = request.body.groups
    refused = [
        group for group in groups if not allowed(request, _DESCRIBE, (ResourceType.GROUP, group.group_id))
    ]
    if not refused:
        return map_reply(handle(request), lambda answer: _offset_fetch_topics(request, answer))
    kept = tuple(group for group in groups if group not in refused)
    errors = [
        {"group_id": group.group_id, "error_code": ErrorCode.group_authorization_failed} for group in refused
    ]
    if not kept:
        return _answer(request, {"groups": errors})
    narrowed = dataclasses.replace(request, body=dataclasses.replace(request.body, groups=kept))
    return map_reply(
        handle(narrowed), lambda answer: _with(_offset_fetch_topics(request, answer), "groups", errors)
    )


def _offset_fetch_topics(request: Request, answer: Any) -> Any:
    """OffsetFetch v8+: within each group, topics the principal may not describe are answered
    TOPIC_AUTHORIZATION_FAILED (named) or left out (all of the group's)."""
    named = {group.group_id: group.topics for group in request.body.groups}
    groups = []
    for group in answer.groups:
        topics = []
        for topic in group.topics:
            if allowed(request, _DESCRIBE, (ResourceType.TOPIC, topic.name)):
                topics.append(topic)
            elif named.get(group.group_id) is not None:
                partitions = tuple(
                    dataclasses.replace(
                        partition, error_code=ErrorCode.topic_authorization_failed, committed_offset=-1
                    )
                    for partition in topic.partitions
                )
                topics.append(dataclasses.replace(topic, partitions=partitions))
        groups.append(dataclasses.replace(group, topics=tuple(topics)))
    return dataclasses.replace(answer, groups=tuple(groups))


def _topic_named(request: Request, entry: Any) -> bool:
    return allowed(request, _DESCRIBE, (ResourceType.TOPIC, entry.name))


def _filter(request: Request, answer: Any, field: str, keep: Callable[[Request, Any], bool]) -> Any:
    return dataclasses.replace(
        answer, **{field: tuple(entry for entry in getattr(answer, field) if keep(request, entry))}
    )


def _operations(request: Request, resource: tuple[ResourceType, str]) -> int:
    authorizer = request.broker.authorizer
    assert authorizer is not None
    return authorizer.authorized_operations(request.session.principal, request.session.host, *resource)


def _metadata(request: Request, handle: Handle) -> Any:
    body = request.body
    requested = body.topics
    every_topic = requested is None or (request.api_version == 0 and not requested)
    refused: list[dict[str, Any]] = []
    narrowed = request
    if not every_topic:
        broker = request.broker
        exists = broker.logs.topics if broker.cluster is None else broker.cluster.view.topics
        auto_create = getattr(body, "allow_auto_topic_creation", True) and broker.config.get_bool(
            "auto.create.topics.enable"
        )
        kept = []
        for topic in requested:
            name = topic.name
            if name is None:  # by id (v10+): the handler answers what it knows
                kept.append(topic)
                continue
            resource = (ResourceType.TOPIC, name)
            may_create = allowed(request, _CREATE, resource) or allowed(request, _CREATE, _CLUSTER)
            if not allowed(request, _DESCRIBE, resource) or (
                auto_create and name not in exists and not may_create
            ):
                refused.append(
                    {"name": name, "error_code": ErrorCode.topic_authorization_failed, "partitions": []}
                )
            else:
                kept.append(topic)
        if refused:
            narrowed = dataclasses.replace(request, body=dataclasses.replace(body, topics=tuple(kept)))

    def change(answer: Any) -> Any:
        if every_topic:
            answer = _filter(request, answer, "topics", _topic_named)
        if getattr(body, "include_topic_authorized_operations", False):
            answer = dataclasses.replace(
                answer,
                topics=tuple(
                    dataclasses.replace(
                        topic,
                        topic_authorized_operations=_operations(
                            request, (ResourceType.TOPIC, str(topic.name))
                        ),
                    )
                    for topic in answer.topics
                ),
            )
        if getattr(body, "include_cluster_authorized_operations", False):
            answer = dataclasses.replace(answer, cluster_authorized_operations=_operations(request, _CLUSTER))
        return _with(answer, "topics", refused) if refused else answer

    return map_reply(handle(narrowed), change)


def _describe_topic_partitions(request: Request, handle: Handle) -> Any:
    named = {topic.name for topic in request.body.topics}

    def change(answer: Any) -> Any:
        topics = []
        for topic in answer.topics:
            resource = (ResourceType.TOPIC, str(topic.name))
            if allowed(request, _DESCRIBE, resource):
                topics.append(
                    dataclasses.replace(topic, topic_authorized_operations=_operations(request, resource))
                )
            elif topic.name in named:
                topics.append(
                    dataclasses.replace(topic, error_code=ErrorCode.topic_authorization_failed, partitions=())
                )
        return dataclasses.replace(answer, topics=tuple(topics))

    return map_reply(handle(request), change)


def _describe_cluster(request: Request, handle: Handle) -> Any:
    if not allowed(request, _DESCRIBE, _CLUSTER):
        return _answer(request, {"error_code": ErrorCode.cluster_authorization_failed, "controller_id": -1})
    if not request.body.include_cluster_authorized_operations:
        return handle(request)
    operations = _operations(request, _CLUSTER)
    return map_reply(
        handle(request), lambda answer: dataclasses.replace(answer, cluster_authorized_operations=operations)
    )


def _describe_groups(request: Request, handle: Handle) -> Any:
    entries = Entries(
        "groups",
        _DESCRIBE,
        lambda request, group: _group(group),
        "groups",
        lambda request, group, code: {"group_id": group, "error_code": code},
    )
    reply = _by_entry(request, handle, entries)
    if not getattr(request.body, "include_authorized_operations", False):
        return reply

    def operations(answer: Any) -> Any:
        return dataclasses.replace(
            answer,
            groups=tuple(
                dataclasses.replace(
                    group, authorized_operations=_operations(request, (ResourceType.GROUP, group.group_id))
                )
                if group.error_code == ErrorCode.none
                else group
                for group in answer.groups
            ),
        )

    return map_reply(reply, operations)


def _list_groups(request: Request, handle: Handle) -> Any:
    if allowed(request, _DESCRIBE, _CLUSTER):
        return handle(request)
    return map_reply(
        handle(request),
        lambda answer: _filter(
            request,
            answer,
            "groups",
            lambda request, group: allowed(request, _DESCRIBE, (ResourceType.GROUP, group.group_id)),
        ),
    )


def _list_transactions(request: Request, handle: Handle) -> Any:
    return map_reply(
        handle(request),
        lambda answer: _filter(
            request,
            answer,
            "transaction_states",
            lambda request, state: allowed(
                request, _DESCRIBE, (ResourceType.TRANSACTIONAL_ID, state.transactional_id)
            ),
        ),
    )


def _cluster_need(operation: Operation) -> tuple[Need, ...]:
    return (Need(operation, lambda request: _CLUSTER),)


def _each(
    field: str, make: Callable[[Any, ErrorCode], dict[str, Any]]
) -> Callable[[Request, ErrorCode], dict[str, Any]]:
    """A whole-request denial answered per entry of the request's list `field`."""

    def denied(request: Request, code: ErrorCode) -> dict[str, Any]:
        return {"results": [make(entry, code) for entry in getattr(request.body, field)]}

    return denied


def _scram_users(request: Request, code: ErrorCode) -> dict[str, Any]:
    names = dict.fromkeys(
        [entry.name for entry in request.body.deletions] + [entry.name for entry in request.body.upsertions]
    )
    return {"results": [{"user": name, "error_code": code} for name in names]}


def _write_txn_markers(request: Request, code: ErrorCode) -> dict[str, Any]:
    return {
        "markers": [
            {
                "producer_id": marker.producer_id,
                "topics": [
                    {
                        "name": topic.name,
                        "partitions": [
                            {"partition_index": index, "error_code": code}
                            for index in topic.partition_indexes
                        ],
                    }
                    for topic in marker.topics
                ],
            }
            for marker in request.body.markers
        ]
    }


def _elect_leaders(request: Request, code: ErrorCode) -> dict[str, Any]:
    topics = request.body.topic_partitions or ()
    return {
        "replica_election_results": [
            {
                "topic": topic.topic,
                "partition_result": [
                    {"partition_id": index, "error_code": code} for index in topic.partitions
                ],
            }
            for topic in topics
        ]
    }


_TOPIC_PARTITIONS = _partitions(
    "name", "partitions", "partition_index", "name", "partitions", "partition_index"
)
_GROUP_NEED = Need(_READ, lambda request: _group(request.body.group_id))
_TXN_NEED = Need(_WRITE, lambda request: _transactional_id(request.body.transactional_id))


def _topic_entries(
    field: str, operation: Operation, answer_field: str, answer: Any, **options: Any
) -> Entries:
    return Entries(
        field, operation, lambda request, topic: _topic_of(request, topic), answer_field, answer, **options
    )


RULES: dict[int, Rule] = {
    0: Rule(  # Produce
        needs=(_TXN_NEED,),
        entries=_topic_entries(
            "topic_data",
            _WRITE,
            "responses",
            _partitions(
                "name", "partition_data", "index", "name", "partition_responses", "index", topic_id=True
            ),
        ),
    ),
    1: Rule(custom=_fetch),
    2: Rule(entries=_topic_entries("topics", _DESCRIBE, "topics", _TOPIC_PARTITIONS)),  # ListOffsets
    3: Rule(custom=_metadata),
    8: Rule(needs=(_GROUP_NEED,), entries=_topic_entries("topics", _READ, "topics", _TOPIC_PARTITIONS)),
    9: Rule(custom=_offset_fetch),
    10: Rule(custom=_find_coordinator),
    11: Rule(needs=(_GROUP_NEED,)),  # JoinGroup
    12: Rule(needs=(_GROUP_NEED,)),  # Heartbeat
    13: Rule(needs=(_GROUP_NEED,)),  # LeaveGroup
    14: Rule(needs=(_GROUP_NEED,)),  # SyncGroup
    15: Rule(custom=_describe_groups),
    16: Rule(custom=_list_groups),
    19: Rule(  # CreateTopics
        entries=_topic_entries("topics", _CREATE, "topics", _named("name", "name"), or_cluster=True),
    ),
    20: Rule(  # DeleteTopics: names before v6, then names or ids
        custom=lambda request, handle: _by_entry(
            request,
            handle,
            Entries(
                "topic_names" if request.api_version < 6 else "topics",
                _DELETE,
                lambda request, topic: _topic(topic) if isinstance(topic, str) else _topic_of(request, topic),
                "responses",
                lambda request, topic, code: {
                    "name": topic if isinstance(topic, str) else topic.name,
                    "topic_id": getattr(topic, "topic_id", None),
                    "error_code": code,
                },
            ),
        )
    ),
    21: Rule(entries=_topic_entries("topics", _DELETE, "topics", _TOPIC_PARTITIONS)),  # DeleteRecords
    22: Rule(custom=_init_producer_id),
    23: Rule(custom=_offset_for_leader_epoch),
    24: Rule(custom=_add_partitions_to_txn),
    25: Rule(
        needs=(_TXN_NEED, Need(_READ, lambda request: _group(request.body.group_id)))
    ),  # AddOffsetsToTxn
    26: Rule(needs=(_TXN_NEED,)),  # EndTxn
    27: Rule(needs=_cluster_need(Operation.CLUSTER_ACTION), denied=_write_txn_markers),  # WriteTxnMarkers
    28: Rule(  # TxnOffsetCommit
        needs=(_TXN_NEED, _GROUP_NEED), entries=_topic_entries("topics", _READ, "topics", _TOPIC_PARTITIONS)
    ),
    29: Rule(needs=_cluster_need(_DESCRIBE), top_level=True),  # DescribeAcls
    30: Rule(  # CreateAcls
        needs=_cluster_need(_ALTER), denied=_each("creations", lambda _, code: {"error_code": code})
    ),
    31: Rule(  # DeleteAcls
        needs=_cluster_need(_ALTER),
        denied=lambda request, code: {"filter_results": [{"error_code": code} for _ in request.body.filters]},
    ),
    32: Rule(  # DescribeConfigs
        entries=Entries("resources", Operation.DESCRIBE_CONFIGS, _config_resource, "results", _config_answer)
    ),
    33: Rule(
        entries=Entries(  # AlterConfigs
            "resources", Operation.ALTER_CONFIGS, _config_resource, "responses", _config_answer
        )
    ),
    35: Rule(needs=_cluster_need(_DESCRIBE), top_level=True),  # DescribeLogDirs
    37: Rule(entries=_topic_entries("topics", _ALTER, "results", _named("name", "name"))),  # CreatePartitions
    42: Rule(
        entries=Entries(  # DeleteGroups
            "groups_names", _DELETE, lambda request, group: _group(group), "results", _named("", "group_id")
        )
    ),
    43: Rule(needs=_cluster_need(_ALTER), denied=_elect_leaders, top_level=True),  # ElectLeaders
    44: Rule(
        entries=Entries(  # IncrementalAlterConfigs
            "resources", Operation.ALTER_CONFIGS, _config_resource, "responses", _config_answer
        )
    ),
    47: Rule(  # OffsetDelete
        needs=(Need(_DELETE, lambda request: _group(request.body.group_id)),),
        entries=_topic_entries("topics", _READ, "topics", _TOPIC_PARTITIONS),
        top_level=True,
    ),
    50: Rule(needs=_cluster_need(_DESCRIBE), top_level=True),  # DescribeUserScramCredentials
    51: Rule(needs=_cluster_need(_ALTER), denied=_scram_users),  # AlterUserScramCredentials
    60: Rule(custom=_describe_cluster),
    61: Rule(
        entries=_topic_entries(  # DescribeProducers
            "topics",
            _READ,
            "topics",
            _partitions("name", "partition_indexes", "", "name", "partitions", "partition_index"),
        )
    ),
    65: Rule(
        entries=Entries(  # DescribeTransactions
            "transactional_ids",
            _DESCRIBE,
            lambda request, name: _transactional_id(name),
            "transaction_states",
            _named("", "transactional_id"),
        )
    ),
    66: Rule(custom=_list_transactions),
    75: Rule(custom=_describe_topic_partitions),
}


def unchecked_apis() -> Sequence[int]:
    """The APIs no rule covers (ApiVersions, SaslHandshake, SaslAuthenticate)."""
    from onceflow.apis import HANDLERS

    return sorted(set(HANDLERS) - set(RULES))
