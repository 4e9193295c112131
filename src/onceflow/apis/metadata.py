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
from onceflow.cluster.controller import ReplicationFactorError, assign_replicas
from onceflow.coordinator.runtime import is_internal
from onceflow.log.errors import LogError
from onceflow.log.manager import validate_topic_name

API_KEY = 3
MIN_VERSION = 0
MAX_VERSION = 13


def handle(request: Request) -> Any:
    broker = request.broker
    body = request.body
    requested = body.topics
    if requested is None or (request.api_version == 0 and not requested):
        names = sorted(broker.logs.topics)  # null (v0: empty) means every topic
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
    if broker.cluster is not None:
        view = broker.cluster.view
        if requested is None or (request.api_version == 0 and not requested):
            names = sorted({*view.topics, *(name for name in names if is_internal(name))})
        topics = [_describe_cluster_topic(request, name, auto_create, topic_operations) for name in names]
        brokers = [
            {"node_id": node.broker_id, "host": node.host, "port": node.port}
            for node in sorted(view.brokers.values(), key=lambda node: node.broker_id)
        ]
        controller_id = view.controller_id
    else:
        topics = [_describe_topic(request, name, auto_create, topic_operations) for name in names]
        endpoint = broker.endpoint
        brokers = [{"node_id": endpoint.node_id, "host": endpoint.host, "port": endpoint.port}]
        controller_id = endpoint.node_id
    return request.respond(
        throttle_time=0,
        error_code=ErrorCode.none,  # v13 (KIP-1102): a top-level error, for a client to re-bootstrap
        brokers=brokers,
        cluster_id=broker.cluster_id,
        controller_id=controller_id,
        topics=topics,
        # v8-v10 only; later versions moved it to DescribeCluster.
        cluster_authorized_operations=(
            CLUSTER_OPERATIONS
            if getattr(body, "include_cluster_authorized_operations", False)
            else OPERATIONS_NOT_REQUESTED
        ),
    )


def _describe_topic(request: Request, name: str, auto_create: bool, operations: int) -> dict[str, Any]:
    logs = request.broker.logs
    info = logs.topics.get(name)
    if info is None and auto_create:
        try:
            info = logs.create_topic(name, request.broker.config.get_int("num.partitions"), {})
        except LogError as error:
            return _missing(name, error.error_code)
    if info is None:
        return _missing(name, ErrorCode.unknown_topic_or_partition)
    node = request.broker.node_id
    partitions = [
        {
            "error_code": ErrorCode.none,
            "partition_index": index,
            "leader_id": node,
            "leader_epoch": 0,
            "replica_nodes": [node],
            "isr_nodes": [node],
            "offline_replicas": [],
        }
        for index in range(info.partitions)
    ]
    return {
        "error_code": ErrorCode.none,
        "name": name,
        "topic_id": info.topic_id,
        "is_internal": is_internal(name),
        "partitions": partitions,
        "topic_authorized_operations": operations,
    }


def _describe_cluster_topic(
    request: Request, name: str, auto_create: bool, operations: int
) -> dict[str, Any]:
    """A topic as ZooKeeper has it. The coordinators' internal topics are the exception: they
    live on the coordinator broker alone (docs/compatibility.md, Cluster mode)."""
    broker = request.broker
    assert broker.cluster is not None
    view = broker.cluster.view
    if is_internal(name):
        info = broker.logs.topics.get(name)
        if info is None:
            return _missing(name, ErrorCode.unknown_topic_or_partition)
        coordinator = view.coordinator_id
        partitions = [
            _partition(index, coordinator, 0, [coordinator], [coordinator], [])
            for index in range(info.partitions)
        ]
        return _topic(name, info.topic_id, partitions, operations)
    assignment = view.topics.get(name)
    if assignment is None:
        if not auto_create:
            return _missing(name, ErrorCode.unknown_topic_or_partition)
        try:
            validate_topic_name(name)
            replicas = assign_replicas(
                name,
                broker.config.get_int("num.partitions"),
                broker.config.get_int("default.replication.factor"),
                view.brokers,
            )
        except LogError as error:
            return _missing(name, error.error_code)
        except ReplicationFactorError:
            return _missing(name, ErrorCode.invalid_replication_factor)
        broker.cluster.create_topic_soon(name, replicas)
        return _missing(name, ErrorCode.leader_not_available)  # as Kafka answers while it creates one
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
