"""DescribeTopicPartitions (75): topics with their partitions, leader, replicas and ISR, a page
at a time, as Kafka's DescribeTopicPartitionsRequestHandler.

Topics go in name order, from the cursor's topic and partition on; a page holds at most
`response_partition_limit` partitions (1 to 2000, Kafka's max.request.partition.size.limit).
A page that stops inside a topic sets the cursor to its next partition; one that stops
between topics, to the next topic's partition 0. An empty topic list means every topic (and
unknown topics are then not reported); a requested topic that does not exist is
UNKNOWN_TOPIC_OR_PARTITION. A cursor outside the requested topics, or with a negative
partition, is INVALID_REQUEST for each requested topic (Kafka's error response).

Topics and partitions are the cluster's (`Broker.metadata`; a single broker's are its own).
"""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import TOPIC_OPERATIONS, Request
from onceflow.coordinator.runtime import is_internal
from onceflow.log.errors import LogError
from onceflow.log.manager import validate_topic_name

API_KEY = 75
MIN_VERSION = 0
MAX_VERSION = 0

MAX_PARTITIONS_PER_PAGE = 2000


def handle(request: Request) -> Any:
    body = request.body
    known = _known_topics(request)
    cursor = body.cursor
    after = cursor.topic_name if cursor is not None else ""
    fetch_all = not body.topics
    requested = known.keys() if fetch_all else {topic.name for topic in body.topics}
    names = sorted(name for name in requested if name >= after)
    if cursor is not None and (
        (not fetch_all and cursor.topic_name not in names) or cursor.partition_index < 0
    ):
        return request.respond(
            throttle_time=0,
            topics=[_unknown(topic.name, ErrorCode.invalid_request) for topic in body.topics],
        )
    remaining = max(min(MAX_PARTITIONS_PER_PAGE, body.response_partition_limit), 1)
    topics: list[dict[str, Any]] = []
    next_cursor = None
    for name in names:
        if remaining == 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        info = known.get(name)
        if info is None:
            if not fetch_all:
                topics.append(_unknown(name, _name_error(name)))
            continue
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        topic_id, partition_count = info
        end = min(partition_count, first + remaining)
        topics.append(
            {
                "error_code": ErrorCode.none,
                "name": name,
                "topic_id": topic_id,
                "is_internal": is_internal(name),
                "partitions": [_partition(request, name, partition) for partition in range(first, end)],
                "topic_authorized_operations": TOPIC_OPERATIONS,
            }
        )
        if end < partition_count:
            next_cursor = {"topic_name": name, "partition_index": end}
            break
        remaining -= end - first
    return request.respond(throttle_time=0, topics=topics, next_cursor=next_cursor)


def _known_topics(request: Request) -> dict[str, tuple[uuid.UUID, int]]:
    """Every topic's id and partition count."""
    view = request.broker.metadata
    return {name: (assignment.topic_id, len(assignment.replicas)) for name, assignment in view.topics.items()}


def _partition(request: Request, topic: str, partition: int) -> dict[str, Any]:
    view = request.broker.metadata
    replicas = list(view.topics[topic].replicas[partition])
    state = view.states.get((topic, partition))
    leader = view.live_leader(topic, partition)
    return {
        "error_code": ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
        "partition_index": partition,
        "leader_id": leader,
        "leader_epoch": state.leader_epoch if state is not None else 0,
        "replica_nodes": replicas,
        "isr_nodes": list(state.isr) if state is not None else [],
        "eligible_leader_replicas": [],
        "last_known_elr": [],
        "offline_replicas": [replica for replica in replicas if replica not in view.brokers],
    }


def _name_error(name: str) -> ErrorCode:
    try:
        validate_topic_name(name)
    except LogError:
        return ErrorCode.invalid_topic_exception
    return ErrorCode.unknown_topic_or_partition


def _unknown(name: str, error: ErrorCode) -> dict[str, Any]:
    return {
        "error_code": error,
        "name": name,
        "topic_id": uuid.UUID(int=0),
        "is_internal": False,
        "partitions": [],
    }
