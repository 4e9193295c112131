"""OffsetDelete (47): delete a group's committed offsets for some partitions, as Kafka does
(see GroupCoordinator.delete_offsets); answered once the tombstones are committed."""

from __future__ import annotations

from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.apis.consumer_groups import when_committed
from onceflow.broker.core import now_ms
from onceflow.coordinator.group_metadata import TopicPartition

API_KEY = 47
MIN_VERSION = 0
MAX_VERSION = 0


def handle(request: Request) -> Any:
    broker = request.broker
    topics = request.body.topics
    shard = group_coordinator(request, request.body.group_id)
    if isinstance(shard, ErrorCode):
        return _refused(request, shard)
    # Partitions that do not exist are UNKNOWN_TOPIC_OR_PARTITION before the group is asked.
    wanted = [
        TopicPartition(topic.name, partition.partition_index)
        for topic in topics
        for partition in topic.partitions
    ]
    known = [partition for partition in wanted if broker.partition_exists(partition)]
    group_error, errors = shard.coordinator.delete_offsets(request.body.group_id, known, now_ms())
    response = request.respond(
        error_code=group_error,
        throttle_time=0,
        topics=[]
        if group_error is not ErrorCode.none
        else [
            {
                "name": topic.name,
                "partitions": [
                    {
                        "partition_index": partition.partition_index,
                        "error_code": errors.get(
                            TopicPartition(topic.name, partition.partition_index),
                            ErrorCode.unknown_topic_or_partition,
                        ),
                    }
                    for partition in topic.partitions
                ],
            }
            for topic in topics
        ],
    )
    return when_committed(request, shard, response, partial(_refused, request))


def _refused(request: Request, code: ErrorCode) -> Any:
    return request.respond(error_code=code, throttle_time=0, topics=[])
