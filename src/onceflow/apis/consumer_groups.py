"""What the consumer-group API handlers share: waiting on the group coordinator, its writes
committed, and the offsets of commit requests."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, once_committed
from onceflow.broker.coordinator_shards import Shard
from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import OffsetAndMetadata, TopicPartition

Result = TypeVar("Result")


def resolver(future: asyncio.Future[Result]) -> Callable[[Result], None]:
    """The callback that hands the coordinator's delayed answer to `future`."""

    def resolve(result: Result) -> None:
        if not future.done():  # cancelled when the client's connection went away
            future.set_result(result)

    return resolve


def when_committed(
    request: Request, shard: Shard[GroupCoordinator], response: Any, refused: Callable[[ErrorCode], Any]
) -> Awaitable[Any]:
    """The response, once every change the coordinator has made so far is committed (fsynced
    and copied by its partition's ISR, as Kafka writes offsets with acks=all): an answered
    commit (or rebalance) survives a crash, and in a cluster the loss of its broker.
    `refused(code)` when it was not committed within `offsets.commit.timeout.ms`
    (COORDINATOR_NOT_AVAILABLE), or the partition moved (NOT_COORDINATOR)."""
    timeout_s = request.broker.config.get_int("offsets.commit.timeout.ms") / 1000
    return once_committed(request, [shard.coordinator.log], timeout_s, response, refused)


def milliseconds(value: datetime.timedelta) -> int:
    return value // datetime.timedelta(milliseconds=1)


def requested_offsets(topics: Iterable[Any], now_ms: int) -> dict[TopicPartition, OffsetAndMetadata]:
    """The offsets of an OffsetCommit or TxnOffsetCommit request."""
    return {
        TopicPartition(topic.name, partition.partition_index): OffsetAndMetadata(
            partition.committed_offset,
            getattr(partition, "committed_leader_epoch", -1),  # v6+ (TxnOffsetCommit v2+)
            partition.committed_metadata or "",
            now_ms,
        )
        for topic in topics
        for partition in topic.partitions
    }


def every_partition(topics: Iterable[Any], code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
    """The same error for each requested partition, as `commit_results` takes errors."""
    return {
        TopicPartition(topic.name, partition.partition_index): code
        for topic in topics
        for partition in topic.partitions
    }


def commit_results(topics: Iterable[Any], errors: Mapping[TopicPartition, ErrorCode]) -> list[dict[str, Any]]:
    """Per requested partition, in request order, its error."""
    return [
        {
            "name": topic.name,
            "partitions": [
                {
                    "partition_index": partition.partition_index,
                    "error_code": errors[TopicPartition(topic.name, partition.partition_index)],
                }
                for partition in topic.partitions
            ],
        }
        for topic in topics
    ]
