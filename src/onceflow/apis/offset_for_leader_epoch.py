"""OffsetForLeaderEpoch (23): one broker, so every partition has leader epoch 0 forever.

In a cluster the epoch is the partition's in ZooKeeper, checked as Kafka checks the client's
current epoch. Batches do not carry epochs yet and logs are never truncated, so the end offset
of any epoch up to the current one is the log end: clients are told to truncate nothing, which
is the truth here.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request

API_KEY = 23
MIN_VERSION = 2
MAX_VERSION = 4

LEADER_EPOCH = 0


def handle(request: Request) -> Any:
    broker = request.broker
    topics = []
    for topic in request.body.topics:
        partitions = []
        for wanted in topic.partitions:
            log = broker.logs.get(topic.topic, wanted.partition)
            current = _leader_epoch(request, topic.topic, wanted.partition)
            if broker.leader_elsewhere(topic.topic, wanted.partition):
                code = ErrorCode.not_leader_or_follower
            elif log is None:
                code = ErrorCode.unknown_topic_or_partition
            elif wanted.current_leader_epoch > current:
                code = ErrorCode.unknown_leader_epoch
            elif 0 <= wanted.current_leader_epoch < current:
                code = ErrorCode.fenced_leader_epoch
            else:
                code = ErrorCode.none
            entry: dict[str, Any] = {"partition": wanted.partition, "error_code": code}
            if log is not None and code == ErrorCode.none and 0 <= wanted.leader_epoch <= current:
                entry.update(leader_epoch=wanted.leader_epoch, end_offset=log.log_end_offset)
            partitions.append(entry)
        topics.append({"topic": topic.topic, "partitions": partitions})
    return request.respond(throttle_time=0, topics=topics)


def _leader_epoch(request: Request, topic: str, partition: int) -> int:
    cluster = request.broker.cluster
    if cluster is None:
        return LEADER_EPOCH
    state = cluster.view.states.get((topic, partition))
    return LEADER_EPOCH if state is None else state.leader_epoch
