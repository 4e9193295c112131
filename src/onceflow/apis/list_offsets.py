"""ListOffsets (2): earliest, latest, max timestamp, or the first offset at a time.

v8 and v9 add the tiered-storage timestamps (KIP-405, KIP-1005) and v10 a timeout for remote
reads. Without tiered storage Kafka answers them from the local log: earliest-local is the log
start offset, and there is no tiered offset (-1). v11 (Kafka 4.2) is not advertised.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.log.log import PartitionLog

API_KEY = 2
MIN_VERSION = 1
MAX_VERSION = 10

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
# The first version that may ask for each special timestamp; any other negative timestamp, or
# one asked for at an older version, is UNSUPPORTED_VERSION, as in Kafka's ReplicaManager.
_FIRST_VERSION = {
    LATEST: 1,
    EARLIEST: 1,
    MAX_TIMESTAMP: 7,
    EARLIEST_LOCAL: 8,
    LATEST_TIERED: 9,
}
READ_COMMITTED = 1
LEADER_EPOCH = 0  # a single broker never changes leader; the cluster mode does not say yet
_NO_EPOCH = -1


def handle(request: Request) -> Any:
    logs = request.broker.logs
    topics = []
    for topic in request.body.topics:
        partitions = []
        for wanted in topic.partitions:
            if not _supported(wanted.timestamp, request.api_version):
                partitions.append(_error(wanted.partition_index, ErrorCode.unsupported_version))
                continue
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
                partitions.append(_error(wanted.partition_index, ErrorCode.unknown_topic_or_partition))
                continue
            hw = request.broker.high_watermark(topic.name, wanted.partition_index, log)
            read_committed = request.body.isolation_level == READ_COMMITTED
            timestamp, offset, leader_epoch = _lookup(log, hw, wanted.timestamp, read_committed)
            partitions.append(
                {
                    "partition_index": wanted.partition_index,
                    "error_code": ErrorCode.none,
                    "timestamp": timestamp,
                    "offset": offset,
                    "leader_epoch": leader_epoch,
                }
            )
        topics.append({"name": topic.name, "partitions": partitions})
    return request.respond(throttle_time=0, topics=topics)


def _supported(timestamp: int, version: int) -> bool:
    if timestamp >= 0:
        return True
    first_version = _FIRST_VERSION.get(timestamp)
    return first_version is not None and version >= first_version


def _error(partition: int, code: ErrorCode) -> dict[str, Any]:
    return {"partition_index": partition, "error_code": code}


def _lookup(log: PartitionLog, hw: int, timestamp: int, read_committed: bool) -> tuple[int, int, int]:
    if timestamp == LATEST:
        return -1, log.last_stable_offset(hw) if read_committed else hw, LEADER_EPOCH
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, log.log_start_offset, LEADER_EPOCH
    if timestamp == LATEST_TIERED:
        return -1, -1, _NO_EPOCH  # nothing is tiered
    found = log.max_timestamp_offset() if timestamp == MAX_TIMESTAMP else log.offset_for_timestamp(timestamp)
    # As Kafka's: nothing a fetch could not read yet (past the high watermark, or the last
    # stable offset for read_committed) is an answer.
    readable = log.last_stable_offset(hw) if read_committed else hw
    if found is None or found[0] >= readable:
        return -1, -1, _NO_EPOCH  # no record at or after that time: Kafka's empty answer
    offset, found_timestamp = found
    return found_timestamp, offset, LEADER_EPOCH
