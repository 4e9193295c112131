"""Metadata (3): brokers, topics and partitions; auto-creates topics when allowed."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import (
    CLUSTER_OPERATIONS,
    OPERATIONS_NOT_REQUESTED,
    TOPIC_OPERATIONS,
    Request,
)
from onceflow.coordinator.runtime import is_internal

API_KEY = 3
MIN_VERSION = 0
MAX_VERSION = 13


def handle(request: Request) -> Any:
    broker = request.broker
    body = request.body
    requested = body.topics
    view = broker.metadata
    if requested is None or (request.api_version == 0 and not requested):
        names = sorted(view.topics)  # null (v0: empty) means every topic
        auto_create = False
    else:
        names = [topic.name for topic in requested if topic.name is not None]
        auto_create = getattr(body, "allow_auto_topic_creation", True) and broker.config.get_bool(
            "auto.create.topics.enable"
        )
    topic_operations = (
        TOPIC_OPERATIONS
        if getattr(body, "include_topic_authorized_operations", False)
        else OPERATIONS_NOT_REQUESTED
    )
    topics = [_describe_topic(request, name, auto_create, topic_operations) for name in names]
    view = broker.metadata  # with the topics created meanwhile
    return request.respond(
        throttle_time=0,
        error_code=ErrorCode.none,  # v13 (KIP-1102): a top-level error, for a client to re-bootstrap
        brokers=[
            {"node_id": node.broker_id, "host": node.host, "port": node.port}
            for node in sorted(view.brokers.values(), key=lambda node: node.broker_id)
        ],
        cluster_id=broker.cluster_id,
        controller_id=view.controller_id,
        topics=topics,
        # v8-v10 only; later versions moved it to DescribeCluster.
        cluster_authorized_operations=(
            CLUSTER_OPERATIONS
            if getattr(body, "include_cluster_authorized_operations", False)
            else OPERATIONS_NOT_REQUESTED
        ),
    )


def _describe_topic(request: Request, name: str, auto_create: bool, operations: int) -> dict[str, Any]:
    """A topic as the cluster's metadata has it (a single broker's: every partition its own).
    The coordinators' internal topics are created by FindCoordinator, not here."""
    broker = request.broker
    view = broker.metadata
    assignment = view.topics.get(name)
    if assignment is None:
        if not auto_create or is_internal(name):
            return _missing(name, ErrorCode.unknown_topic_or_partition)
        code = broker.auto_create_topic(name)
        view = broker.metadata
        assignment = view.topics.get(name)
        if assignment is None:
            return _missing(name, code)
    partitions = []
    for index, nodes in enumerate(assignment.replicas):
        state = view.states.get((name, index))
        offline = [replica for replica in nodes if replica not in view.brokers]
        if state is None:
            partitions.append(_partition(index, -1, 0, list(nodes), [], offline))
        else:
            leader = view.live_leader(name, index)
            partitions.append(
                _partition(index, leader, state.leader_epoch, list(nodes), list(state.isr), offline)
            )
    return _topic(name, assignment.topic_id, partitions, operations)


def _partition(
    index: int, leader: int, leader_epoch: int, replicas: list[int], isr: list[int], offline: list[int]
) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
        "partition_index": index,
        "leader_id": leader,
        "leader_epoch": leader_epoch,
        "replica_nodes": replicas,
        "isr_nodes": isr,
        "offline_replicas": offline,
    }


def _topic(
    name: str, topic_id: uuid.UUID, partitions: list[dict[str, Any]], operations: int
) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "name": name,
        "topic_id": topic_id,
        "is_internal": is_internal(name),
        "partitions": partitions,
        "topic_authorized_operations": operations,
    }


def _missing(name: str, code: ErrorCode) -> dict[str, Any]:
    return {"error_code": code, "name": name, "topic_id": None, "partitions": []}
