"""ListOffsets (2): earliest, latest, max timestamp, or the first offset at a time.

v8 and v9 add the tiered-storage timestamps (KIP-405, KIP-1005) and v10 a timeout for remote
reads. Without tiered storage Kafka answers them from the local log: earliest-local is the log
start offset, and there is no tiered offset (-1). v11 (Kafka 4.2) is not advertised.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.log.batch import CorruptRecordError
from onceflow.log.errors import UnknownTopicError
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
    # v0 and v1 have no isolation level: they read uncommitted.
    read_committed = getattr(request.body, "isolation_level", 0) == READ_COMMITTED
    topics = []
    searches: list[tuple[dict[str, Any], PartitionLog, int, int]] = []  # by time, off the loop
    for topic in request.body.topics:
        partitions = []
        for wanted in topic.partitions:
            if not _supported(wanted.timestamp, request.api_version):
                partitions.append(_error(wanted.partition_index, ErrorCode.unsupported_version))
                continue
            log = logs.get(topic.name, wanted.partition_index)
            if request.broker.leader_elsewhere(topic.name, wanted.partition_index):
                partitions.append(_error(wanted.partition_index, ErrorCode.not_leader_or_follower))
                continue
            if log is None:
                partitions.append(_error(wanted.partition_index, ErrorCode.unknown_topic_or_partition))
                continue
            hw = request.broker.high_watermark(topic.name, wanted.partition_index, log)
            # As Kafka's: nothing a fetch could not read yet (past the high watermark, or the
            # last stable offset for read_committed) is an answer.
            readable = log.last_stable_offset(hw) if read_committed else hw
            answer: dict[str, Any] = {"partition_index": wanted.partition_index, "error_code": ErrorCode.none}
            found = _special(log, readable, wanted.timestamp)
            if found is None:
                searches.append((answer, log, wanted.timestamp, readable))
            else:
                answer.update(found)
            partitions.append(answer)
        topics.append({"name": topic.name, "partitions": partitions})
    if searches:
        return _after_searches(request, searches, topics)
    return request.respond(throttle_time=0, topics=topics)


async def _after_searches(
    request: Request, searches: list[tuple[dict[str, Any], PartitionLog, int, int]], topics: list[Any]
) -> Any:
    """Searches by timestamp read and decode whole batches: on the broker's record thread, with
    the segments kept open meanwhile."""
    for answer, log, timestamp, readable in searches:
        try:
            found = await request.broker.run_record_work(_search, log, timestamp)
        except CorruptRecordError:
            answer["error_code"] = ErrorCode.corrupt_message
            continue
        except UnknownTopicError:  # deleted while the search waited for the thread
            answer["error_code"] = ErrorCode.unknown_topic_or_partition
            continue
        if found is None or found[0] >= readable:
            answer.update(timestamp=-1, offset=-1, leader_epoch=_NO_EPOCH)  # Kafka's empty answer
        else:
            answer.update(timestamp=found[1], offset=found[0], leader_epoch=LEADER_EPOCH)
    return request.respond(throttle_time=0, topics=topics)


def _search(log: PartitionLog, timestamp: int) -> tuple[int, int] | None:
    with log.segments_pinned():
        if timestamp == MAX_TIMESTAMP:
            return log.max_timestamp_offset()
        return log.offset_for_timestamp(timestamp)


def _supported(timestamp: int, version: int) -> bool:
    if timestamp >= 0:
        return True
    first_version = _FIRST_VERSION.get(timestamp)
    return first_version is not None and version >= first_version


def _error(partition: int, code: ErrorCode) -> dict[str, Any]:
    return {"partition_index": partition, "error_code": code}


def _special(log: PartitionLog, readable: int, timestamp: int) -> dict[str, int] | None:
    """The answer to a special timestamp (latest, earliest, tiered); None for a search by time."""
    if timestamp == LATEST:
        return {"timestamp": -1, "offset": readable, "leader_epoch": LEADER_EPOCH}
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return {"timestamp": -1, "offset": log.log_start_offset, "leader_epoch": LEADER_EPOCH}
    if timestamp == LATEST_TIERED:
        return {"timestamp": -1, "offset": -1, "leader_epoch": _NO_EPOCH}  # nothing is tiered
    return None
