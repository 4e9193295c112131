"""OffsetFetch (9): committed offsets of a group (v8: of several groups).

Null topics means every committed partition of the group; a partition without a commit
answers -1. With `require_stable`, a partition with offsets staged by an open transaction
answers UNSTABLE_OFFSET_COMMIT, and the client retries. v9 adds KIP-848's member id and epoch,
which a classic group ignores, as Kafka's does.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.apis.consumer_groups import when_committed
from onceflow.broker.coordinator_shards import Shard
from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import TopicPartition
from onceflow.coordinator.runtime import write_error

API_KEY = 9
MIN_VERSION = 1
MAX_VERSION = 9


def handle(request: Request) -> Any:
    body = request.body
    require_stable = request.api_version >= 7 and body.require_stable
    if request.api_version >= 8:
        groups = []
        shards: dict[int, Shard[GroupCoordinator]] = {}
        for group in body.groups:
            shard = group_coordinator(request, group.group_id)
            if isinstance(shard, ErrorCode):
                groups.append({"group_id": group.group_id, "topics": [], "error_code": shard})
                continue
            shards[shard.partition] = shard
            topics = _fetch(shard.coordinator, group.group_id, group.topics, require_stable)
            groups.append({"group_id": group.group_id, "topics": topics, "error_code": ErrorCode.none})
        return _groups_once_committed(request, groups, list(shards.values()))
    shard = group_coordinator(request, body.group_id)
    if isinstance(shard, ErrorCode):
        return _refused(request, shard)
    topics = _fetch(shard.coordinator, body.group_id, body.topics, require_stable)
    response = request.respond(throttle_time=0, topics=topics, error_code=ErrorCode.none)
    # Only what is committed is reported: an offset read here never goes back after a crash or
    # a failover.
    return when_committed(request, shard, response, partial(_refused, request))


async def _groups_once_committed(
    request: Request, groups: list[dict[str, Any]], shards: list[Shard[GroupCoordinator]]
) -> Any:
    """v8: the groups once each coordinator's offsets are committed; the groups of one whose
    are not answer why, without offsets."""
    timeout_s = request.broker.config.get_int("offsets.commit.timeout.ms") / 1000
    for shard in shards:
        code = await request.broker.wait_committed([shard.coordinator.log], timeout_s)
        if code == ErrorCode.none:
            continue
        for group in groups:
            if request.broker.groups.partition_of(group["group_id"]) == shard.partition:
                group.update(topics=[], error_code=write_error(code))
    return request.respond(throttle_time=0, groups=groups)


def _refused(request: Request, code: ErrorCode) -> Any:
    if request.api_version < 2:  # no error code of its own: each partition carries it
        topics = [
            {
                "name": topic.name,
                "partitions": [
                    {"partition_index": index, "committed_offset": -1, "metadata": "", "error_code": code}
                    for index in topic.partition_indexes
                ],
            }
            for topic in request.body.topics
        ]
        return request.respond(throttle_time=0, topics=topics)
    return request.respond(throttle_time=0, topics=[], error_code=code)


def _fetch(
    coordinator: GroupCoordinator, group_id: str, topics: Iterable[Any] | None, require_stable: bool
) -> list[dict[str, Any]]:
    partitions = (
        None
        if topics is None
        else [TopicPartition(topic.name, index) for topic in topics for index in topic.partition_indexes]
    )
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for fetched in coordinator.fetch_offsets(group_id, partitions, require_stable):
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
