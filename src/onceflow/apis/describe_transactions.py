"""DescribeTransactions (65): the coordinator's view of transactional ids."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, transaction_coordinator

API_KEY = 65
MIN_VERSION = 0
MAX_VERSION = 0


def handle(request: Request) -> Any:
    states = []
    for transactional_id in request.body.transactional_ids:
        shard = transaction_coordinator(request, transactional_id)
        metadata = (
            None if isinstance(shard, ErrorCode) else shard.coordinator.transactions.get(transactional_id)
        )
        if metadata is None:
            states.append(
                {
                    "error_code": shard
                    if isinstance(shard, ErrorCode)
                    else ErrorCode.transactional_id_not_found,
                    "transactional_id": transactional_id,
                    "transaction_state": "",
                    "transaction_timeout": 0,
                    "transaction_start_time": -1,
                    "producer_id": -1,
                    "producer_epoch": -1,
                    "topics": [],
                }
            )
            continue
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in sorted(metadata.partitions):
            by_topic[topic].append(partition)
        states.append(
            {
                "error_code": ErrorCode.none,
                "transactional_id": transactional_id,
                "transaction_state": metadata.state.value,
                "transaction_timeout": metadata.timeout_ms,
                "transaction_start_time": metadata.start_ms,
                "producer_id": metadata.producer_id,
                "producer_epoch": metadata.producer_epoch,
                "topics": [
                    {"topic": topic, "partitions": partitions} for topic, partitions in by_topic.items()
                ],
            }
        )
    return request.respond(throttle_time=0, transaction_states=states)
