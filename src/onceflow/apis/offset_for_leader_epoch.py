"""OffsetForLeaderEpoch (23): where a leader epoch ends in this broker's log (KIP-101/279).

Followers ask it of their leader before fetching, to cut any suffix the leader does not have
(`broker.replication`); clients ask it to detect truncation (KIP-320). The answer comes from the
partition's leader-epoch cache: the largest epoch at or below the one asked and the offset where
the next epoch began, or the log end for the latest. The client's current epoch is checked
against the partition's in ZooKeeper, as Kafka checks it.

One broker alone stamps no epochs and never truncates: every partition has leader epoch 0
forever, and any epoch up to it ends at the log end, which tells clients to truncate nothing.
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
            if log is not None and code == ErrorCode.none:
                epochs = log.leader_epochs
                if epochs.entries:
                    epoch, end_offset = epochs.end_offset_for(wanted.leader_epoch, log.log_end_offset)
                    entry.update(leader_epoch=epoch, end_offset=end_offset)
                elif 0 <= wanted.leader_epoch <= current:
                    entry.update(leader_epoch=wanted.leader_epoch, end_offset=log.log_end_offset)
            partitions.append(entry)
        topics.append({"topic": topic.topic, "partitions": partitions})
    return request.respond(throttle_time=0, topics=topics)


def _leader_epoch(request: Request, topic: str, partition: int) -> int:
    state = request.broker.metadata.states.get((topic, partition))
    return LEADER_EPOCH if state is None else state.leader_epoch
