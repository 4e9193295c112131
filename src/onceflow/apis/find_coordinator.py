"""FindCoordinator (10): the broker that coordinates a group or a transactional id (v4+: several).

As Kafka: the coordinator of a key is the leader of the partition of the internal topic that
holds it (`__consumer_offsets` for groups, `__transaction_state` for transactional ids, partition
abs(hash(key)) % partitions, `coordinator.placement`). A topic that does not exist yet is created
on the way (`Broker.ensure_internal_topic`: a cluster waits for `*.replication.factor` live
brokers), and until it has a live leader for the key's partition the answer is
COORDINATOR_NOT_AVAILABLE; clients ask again. The leader named may still be loading the
partition: it answers COORDINATOR_LOAD_IN_PROGRESS, and clients retry there. A single broker
names itself once the topic exists. v5 only allows an error code (KIP-890) this broker has no
cause to answer; v6 adds share groups (KIP-932), which do not exist here (INVALID_REQUEST).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.cluster.znodes import NO_LEADER
from onceflow.internal_topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_LOG

API_KEY = 10
MIN_VERSION = 0
MAX_VERSION = 6  # v5 and v6 are v4; v6's key type 2 (share groups) is INVALID_REQUEST here

INTERNAL_TOPICS = {0: CONSUMER_OFFSETS_TOPIC, 1: TRANSACTION_LOG}  # by key type: group, transaction


def handle(request: Request) -> Any:
    body = request.body
    key_type = getattr(body, "key_type", 0)
    if request.api_version >= 4:
        coordinators = [{"key": key, **_find(request, key_type, key)} for key in body.coordinator_keys]
        return request.respond(throttle_time=0, coordinators=coordinators)
    return request.respond(throttle_time=0, **_find(request, key_type, body.key))


def _find(request: Request, key_type: int, key: str) -> dict[str, Any]:
    topic = INTERNAL_TOPICS.get(key_type)
    if topic is None:
        return _not_found(ErrorCode.invalid_request, f"unknown key type {key_type}")
    broker = request.broker
    broker.ensure_internal_topic(topic)
    view = broker.metadata
    node_id = view.coordinator(topic, key)
    if node_id == NO_LEADER:
        why = (
            f"{topic} has no live leader for this key yet"
            if view.partition_count(topic)
            else f"{topic} is not created yet"
        )
        return _not_found(ErrorCode.coordinator_not_available, why)
    registration = view.brokers[node_id]
    return {
        "error_code": ErrorCode.none,
        "error_message": None,
        "node_id": node_id,
        "host": registration.host,
        "port": registration.port,
    }


def _not_found(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "node_id": -1, "host": "", "port": -1}
