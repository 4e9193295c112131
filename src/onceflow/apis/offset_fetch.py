"""OffsetFetch (9): committed offsets of a group (v8: of several groups).

Null topics means every committed partition of the group; a partition without a commit
answers -1. With `require_stable`, a partition with offsets staged by an open transaction
answers UNSTABLE_OFFSET_COMMIT, and the client retries. v9 adds KIP-848's member id and epoch,
which a classic group ignores, as Kafka's does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, coordinator_elsewhere
from onceflow.apis.consumer_groups import when_durable
from onceflow.coordinator.group_metadata import TopicPartition

API_KEY = 9
MIN_VERSION = 1
MAX_VERSION = 9


def handle(request: Request) -> Any:
    body = request.body
    if coordinator_elsewhere(request):
        if request.api_version >= 8:
            groups = [
                {"group_id": group.group_id, "topics": [], "error_code": ErrorCode.not_coordinator}
                for group in body.groups
            ]
            return request.respond(throttle_time=0, groups=groups)
        if request.api_version < 2:  # no error code of its own: each partition carries it
            topics = [
                {
                    "name": topic.name,
                    "partitions": [
                        {
                            "partition_index": index,
                            "committed_offset": -1,
                            "metadata": "",
                            "error_code": ErrorCode.not_coordinator,
                        }
                        for index in topic.partition_indexes
                    ],
                }
                for topic in body.topics
            ]
            return request.respond(throttle_time=0, topics=topics)
        return request.respond(throttle_time=0, topics=[], error_code=ErrorCode.not_coordinator)
    require_stable = request.api_version >= 7 and body.require_stable
    if request.api_version >= 8:
        groups = [
            {
                "group_id": group.group_id,
                "topics": _fetch(request, group.group_id, group.topics, require_stable),
                "error_code": ErrorCode.none,
            }
            for group in body.groups
        ]
        response = request.respond(throttle_time=0, groups=groups)
    else:
        topics = _fetch(request, body.group_id, body.topics, require_stable)
        response = request.respond(throttle_time=0, topics=topics, error_code=ErrorCode.none)
    # Only what is durable is reported: an offset read here never goes back after a crash.
    return when_durable(request, response)


def _fetch(
    request: Request, group_id: str, topics: Iterable[Any] | None, require_stable: bool
) -> list[dict[str, Any]]:
    partitions = (
        None
        if topics is None
        else [TopicPartition(topic.name, index) for topic in topics for index in topic.partition_indexes]
    )
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for fetched in request.broker.groups.fetch_offsets(group_id, partitions, require_stable):
        offset = fetched.offset
        by_topic.setdefault(fetched.partition.topic, []).append(
            {
                "partition_index": fetched.partition.partition,
                "committed_offset": offset.offset if offset else -1,
                "committed_leader_epoch": offset.leader_epoch if offset else -1,
                "metadata": offset.metadata if offset else "",
                "error_code": fetched.error,
            }
        )
    return [{"name": name, "partitions": partitions} for name, partitions in by_topic.items()]
