"""DeleteRecords (21): move partitions' log start offsets (low watermarks) forward.

As Kafka's leader: offset -1 means the high watermark, an offset past the high watermark (or
below -1) is OFFSET_OUT_OF_RANGE, an offset at or below the current start changes nothing, and
a topic whose cleanup.policy lacks `delete` (the coordinators' logs, compacted in Kafka) is
POLICY_VIOLATION. The new start is fsynced before the answer; whole segments below it go.
In a cluster only the partition's leader answers; its followers move their starts when their
next fetch brings the leader's (Kafka's leader waits for that before answering).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.coordinator.runtime import is_internal

API_KEY = 21
MIN_VERSION = 0
MAX_VERSION = 2

HIGH_WATERMARK = -1


def handle(request: Request) -> Any:
    return request.respond(
        throttle_time=0,
        topics=[
            {
                "name": topic.name,
                "partitions": [_delete(request, topic.name, wanted) for wanted in topic.partitions],
            }
            for topic in request.body.topics
        ],
    )


def _delete(request: Request, topic: str, wanted: Any) -> dict[str, Any]:
    broker = request.broker
    logs = broker.logs
    result = {"partition_index": wanted.partition_index, "low_watermark": -1}
    if broker.leader_elsewhere(topic, wanted.partition_index):
        return {**result, "error_code": ErrorCode.not_leader_or_follower}
    log = logs.get(topic, wanted.partition_index)
    if log is None:
        return {**result, "error_code": ErrorCode.unknown_topic_or_partition}
    policy = logs.topics[topic].configs.get("cleanup.policy", "delete")
    if is_internal(topic) or "delete" not in (item.strip() for item in policy.split(",")):
        return {**result, "error_code": ErrorCode.policy_violation}
    hw = broker.high_watermark(topic, wanted.partition_index, log)
    offset = hw if wanted.offset == HIGH_WATERMARK else wanted.offset
    if not 0 <= offset <= hw:
        return {**result, "error_code": ErrorCode.offset_out_of_range}
    try:
        low_watermark = log.delete_records_before(offset)
    except OSError:
        return {**result, "error_code": ErrorCode.kafka_storage_error}
    return {**result, "low_watermark": low_watermark, "error_code": ErrorCode.none}
