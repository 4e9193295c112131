"""Metadata (3): brokers, topics and partitions; auto-creates topics when allowed."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import (
    CLUSTER_OPERATIONS,
    OPERATIONS_NOT_REQUESTED,
    TOPIC_OPERATIONS,
    Request,
    is_internal,
)
from onceflow.log.errors import LogError

API_KEY = 3
MIN_VERSION = 0
MAX_VERSION = 12


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
    topics = [_describe_topic(request, name, auto_create, topic_operations) for name in names]
    endpoint = broker.endpoint
    return request.respond(
        throttle_time=0,
        brokers=[{"node_id": endpoint.node_id, "host": endpoint.host, "port": endpoint.port}],
        cluster_id=broker.cluster_id,
        controller_id=endpoint.node_id,
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


def _missing(name: str, code: ErrorCode) -> dict[str, Any]:
    return {"error_code": code, "name": name, "topic_id": None, "partitions": []}
