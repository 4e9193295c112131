"""AddPartitionsToTxn (24): partitions join the producer's transaction before it writes to them.

v0-3 carry one transaction, from its producer. v4+ is KIP-890's batched form, meant for brokers:
several transactions, each either added as in v3 or, with `verify_only`, only checked (is each
partition in the open transaction?), as a partition leader asks the coordinator under
transaction version 2. Clients use it only when the broker advertises that version (it does not);
without an authorizer, as Kafka without one, anyone may send it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, coordinator_elsewhere, for_version
from onceflow.broker.core import now_ms

API_KEY = 24
MIN_VERSION = 0
MAX_VERSION = 5
FIRST_VERSION_WITH_PRODUCER_FENCED = 2
FIRST_BATCHED_VERSION = 4


def handle(request: Request) -> Any:
    body = request.body
    if request.api_version < FIRST_BATCHED_VERSION:
        transactions = [
            (
                body.v3_and_below_transactional_id,
                body.v3_and_below_producer_id,
                body.v3_and_below_producer_epoch,
                False,
                body.v3_and_below_topics,
            )
        ]
    else:
        transactions = [
            (txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.verify_only, txn.topics)
            for txn in body.transactions
        ]
    results = []
    settled = []
    for transactional_id, producer_id, producer_epoch, verify_only, topics in transactions:
        wanted = [(topic.name, partition) for topic in topics for partition in topic.partitions]
        if coordinator_elsewhere(request):
            errors = dict.fromkeys(wanted, ErrorCode.not_coordinator)
        elif not transactional_id:
            errors = dict.fromkeys(wanted, ErrorCode.invalid_request)
        elif verify_only:
            errors = request.broker.transactions.verify_partitions(
                transactional_id, producer_id, producer_epoch, wanted
            )
        else:
            reply = request.broker.transactions.add_partitions(
                transactional_id, producer_id, producer_epoch, wanted, now_ms()
            )
            errors = reply.reply
            settled.append(request.broker.settle(reply))
        results.append((transactional_id, _by_topic(errors, request.api_version)))
    if request.api_version < FIRST_BATCHED_VERSION:
        answer = request.respond(throttle_time=0, results_by_topic_v3_and_below=results[0][1])
    else:
        answer = request.respond(
            throttle_time=0,
            error_code=ErrorCode.none,
            results_by_transaction=[
                {"transactional_id": transactional_id, "topic_results": topics}
                for transactional_id, topics in results
            ],
        )
    return _once(settled, answer)


def _by_topic(errors: Mapping[tuple[str, int], ErrorCode], version: int) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (topic, partition), code in errors.items():
        by_topic[topic].append(
            {
                "partition_index": partition,
                "partition_error_code": for_version(code, version, FIRST_VERSION_WITH_PRODUCER_FENCED),
            }
        )
    return [{"name": topic, "results_by_partition": partitions} for topic, partitions in by_topic.items()]


async def _once(settled: Iterable[Any], answer: Any) -> Any:
    """The answer once every added transaction's reply is settled (durable)."""
    await asyncio.gather(*settled)
    return answer
