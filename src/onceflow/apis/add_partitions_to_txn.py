"""AddPartitionsToTxn (24): partitions join the producer's transaction before it writes to them.

Versions 0-3 only: v4+ is KIP-890's batched broker-side form, which clients use only when
the broker advertises `transaction.version` 2 (it does not).
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, for_version, once_settled, transaction_coordinator
from onceflow.broker.core import now_ms

API_KEY = 24
MIN_VERSION = 0
MAX_VERSION = 3
FIRST_VERSION_WITH_PRODUCER_FENCED = 2


def handle(request: Request) -> Any:
    body = request.body
    wanted = [(topic.name, partition) for topic in body.v3_and_below_topics for partition in topic.partitions]
    shard = transaction_coordinator(request, body.v3_and_below_transactional_id)
    if isinstance(shard, ErrorCode):
        return _refused(request, shard)
    reply = shard.coordinator.add_partitions(
        body.v3_and_below_transactional_id,
        body.v3_and_below_producer_id,
        body.v3_and_below_producer_epoch,
        wanted,
        now_ms(),
    )
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (topic, partition), code in reply.reply.items():
        by_topic[topic].append(
            {
                "partition_index": partition,
                "partition_error_code": for_version(
                    code, request.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED
                ),
            }
        )
    answer = request.respond(
        throttle_time=0,
        results_by_topic_v3_and_below=[
            {"name": topic, "results_by_partition": partitions} for topic, partitions in by_topic.items()
        ],
    )
    return once_settled(request, shard, reply, answer, partial(_refused, request))


def _refused(request: Request, code: ErrorCode) -> Any:
    """Every partition of the request answered `code`."""
    return request.respond(
        throttle_time=0,
        results_by_topic_v3_and_below=[
            {
                "name": topic.name,
                "results_by_partition": [
                    {"partition_index": partition, "partition_error_code": code}
                    for partition in topic.partitions
                ],
            }
            for topic in request.body.v3_and_below_topics
        ],
    )
