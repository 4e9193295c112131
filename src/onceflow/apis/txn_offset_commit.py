"""TxnOffsetCommit (28): stage offsets in a transaction; EndTxn makes them visible or drops them.

The transaction coordinator first checks that the producer's session is current and that
the group joined its open transaction (AddOffsetsToTxn), when this broker coordinates the
transactional id too; when another broker does, Kafka's group coordinator does not ask it either
(before KIP-890), and the commit marker settles only what the transaction's own epoch staged.
v3 (KIP-447) carries the member's generation, member id and group.instance.id, checked as an
OffsetCommit's are.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, for_version, group_coordinator, transaction_coordinator
from onceflow.apis.consumer_groups import commit_results, every_partition, requested_offsets, when_committed
from onceflow.broker.core import now_ms

API_KEY = 28
MIN_VERSION = 0
# v4 and v5 are v3: v5 would add the group to the transaction itself only under transaction.version
# 2 (KIP-890), which this broker does not advertise, so clients send AddOffsetsToTxn first.
MAX_VERSION = 5
FIRST_VERSION_WITH_PRODUCER_FENCED = 3


def handle(request: Request) -> Any:
    body = request.body
    shard = group_coordinator(request, body.group_id)
    if isinstance(shard, ErrorCode):
        return _refused(request, shard)
    now = now_ms()
    transactions = transaction_coordinator(request, body.transactional_id)
    if not isinstance(transactions, ErrorCode):
        code = transactions.coordinator.check_offset_commit(
            body.producer_id, body.producer_epoch, body.group_id
        )
        if code != ErrorCode.none and body.group_id:  # an invalid group id is for the group coordinator
            return _refused(
                request, for_version(code, request.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED)
            )
    with_member = request.api_version >= 3
    errors = shard.coordinator.commit_transactional_offsets(
        body.group_id,
        body.producer_id,
        body.producer_epoch,
        body.generation_id if with_member else -1,
        body.member_id if with_member else "",
        body.group_instance_id if with_member else None,
        requested_offsets(body.topics, now),
        now,
    )
    response = request.respond(throttle_time=0, topics=commit_results(body.topics, errors))
    return when_committed(request, shard, response, partial(_refused, request))


def _refused(request: Request, code: ErrorCode) -> Any:
    """Every partition of the request answered `code`."""
    topics = request.body.topics
    return request.respond(throttle_time=0, topics=commit_results(topics, every_partition(topics, code)))
