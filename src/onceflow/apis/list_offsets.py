"""ListOffsets (2): earliest, latest, max timestamp, or the first offset at a time."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.log.log import PartitionLog

API_KEY = 2
MIN_VERSION = 1
MAX_VERSION = 7

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
READ_COMMITTED = 1


def handle(request: Request) -> Any:
    logs = request.broker.logs
    topics = []
    for topic in request.body.topics:
        partitions = []
        for wanted in topic.partitions:
            log = logs.get(topic.name, wanted.partition_index)
            if request.broker.leader_elsewhere(topic.name, wanted.partition_index):
                partitions.append(
                    {
                        "partition_index": wanted.partition_index,
                        "error_code": ErrorCode.not_leader_or_follower,
                    }
                )
                continue
            if log is None:
                partitions.append(
                    {
                        "partition_index": wanted.partition_index,
                        "error_code": ErrorCode.unknown_topic_or_partition,
                    }
                )
                continue
            hw = request.broker.high_watermark(topic.name, wanted.partition_index, log)
            read_committed = request.body.isolation_level == READ_COMMITTED
            timestamp, offset = _lookup(log, hw, wanted.timestamp, read_committed)
            partitions.append(
                {
                    "partition_index": wanted.partition_index,
                    "error_code": ErrorCode.none,
                    "timestamp": timestamp,
                    "offset": offset,
                    "leader_epoch": 0,
                }
            )
        topics.append({"name": topic.name, "partitions": partitions})
    return request.respond(throttle_time=0, topics=topics)


def _lookup(log: PartitionLog, hw: int, timestamp: int, read_committed: bool) -> tuple[int, int]:
    if timestamp == LATEST:
        return -1, log.last_stable_offset(hw) if read_committed else hw
    if timestamp == EARLIEST:
        return -1, log.log_start_offset
    found = log.max_timestamp_offset() if timestamp == MAX_TIMESTAMP else log.offset_for_timestamp(timestamp)
    if found is None:
        return -1, -1  # no record at or after that time
    offset, found_timestamp = found
    return found_timestamp, offset
