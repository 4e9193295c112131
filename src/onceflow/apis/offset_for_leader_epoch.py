"""OffsetForLeaderEpoch (23): one broker, so every partition has leader epoch 0 forever."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request

API_KEY = 23
MIN_VERSION = 2
MAX_VERSION = 4

LEADER_EPOCH = 0


def handle(request: Request) -> Any:
    logs = request.broker.logs
    topics = []
    for topic in request.body.topics:
        partitions = []
        for wanted in topic.partitions:
            log = logs.get(topic.topic, wanted.partition)
            if log is None:
                code = ErrorCode.unknown_topic_or_partition
            elif wanted.current_leader_epoch > LEADER_EPOCH:
                code = ErrorCode.unknown_leader_epoch
            else:
                code = ErrorCode.none
            entry: dict[str, Any] = {"partition": wanted.partition, "error_code": code}
            if log is not None and code == ErrorCode.none and wanted.leader_epoch == LEADER_EPOCH:
                entry.update(leader_epoch=LEADER_EPOCH, end_offset=log.log_end_offset)
            partitions.append(entry)
        topics.append({"topic": topic.topic, "partitions": partitions})
    return request.respond(throttle_time=0, topics=topics)
