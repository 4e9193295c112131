"""DescribeProducers (61): the producer state of partitions, for finding hanging transactions."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request

API_KEY = 61
MIN_VERSION = 0
MAX_VERSION = 0


def handle(request: Request) -> Any:
    logs = request.broker.logs
    topics = []
    for topic in request.body.topics:
        partitions = []
        for index in topic.partition_indexes:
            log = logs.get(topic.name, index)
            if log is None:
                partitions.append(
                    {
                        "partition_index": index,
                        "error_code": ErrorCode.unknown_topic_or_partition,
                        "active_producers": [],
                    }
                )
                continue
            producers = [
                {
                    "producer_id": entry.producer_id,
                    "producer_epoch": entry.epoch,
                    "last_sequence": entry.last_seq,
                    "last_timestamp": entry.last_timestamp,
                    "coordinator_epoch": entry.coordinator_epoch,
                    "current_txn_start_offset": entry.current_txn_first_offset,
                }
                for entry in log.producer_state.entries()
            ]
            partitions.append(
                {"partition_index": index, "error_code": ErrorCode.none, "active_producers": producers}
            )
        topics.append({"name": topic.name, "partitions": partitions})
    return request.respond(throttle_time=0, topics=topics)
