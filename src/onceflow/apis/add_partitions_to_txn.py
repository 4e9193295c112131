"""AddPartitionsToTxn (24): partitions join the producer's transaction before it writes to them.

v0-3 carry one transaction, from its producer. v4+ is KIP-890's batched form, meant for brokers:
several transactions, each either added as in v3 or, with `verify_only`, only checked (is each
partition in the open transaction?), as a partition leader asks the coordinator under
transaction version 2. Clients use it only when the broker advertises that version (it does not).
Each transaction is answered by the coordinator of its id here, or NOT_COORDINATOR.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, for_version, transaction_coordinator
from onceflow.broker.core import now_ms

API_KEY = 24
MIN_VERSION = 0
MAX_VERSION = 5
FIRST_VERSION_WITH_PRODUCER_FENCED = 2
FIRST_BATCHED_VERSION = 4

Errors = Mapping[tuple[str, int], ErrorCode]


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
    results: list[tuple[str, Errors, Any]] = []  # with the settling of what was added
    for transactional_id, producer_id, producer_epoch, verify_only, topics in transactions:
        wanted = [(topic.name, partition) for topic in topics for partition in topic.partitions]
        shard = transaction_coordinator(request, transactional_id) if transactional_id else None
        if not transactional_id:
            results.append((transactional_id, dict.fromkeys(wanted, ErrorCode.invalid_request), None))
        elif isinstance(shard, ErrorCode):
            results.append((transactional_id, dict.fromkeys(wanted, shard), None))
        elif verify_only:
            assert shard is not None
            errors = shard.coordinator.verify_partitions(
                transactional_id, producer_id, producer_epoch, wanted
            )
            results.append((transactional_id, errors, None))
        else:
            assert shard is not None
            reply = shard.coordinator.add_partitions(
                transactional_id, producer_id, producer_epoch, wanted, now_ms()
            )
            results.append((transactional_id, reply.reply, request.broker.settle(shard, reply)))
    return _once_settled(request, results)


async def _once_settled(request: Request, results: list[tuple[str, Errors, Any]]) -> Any:
    """The answer once every added transaction's reply is settled (committed); a transaction whose
    write failed answers the code of the failure for each of its partitions (the client retries)."""
    codes = await asyncio.gather(*(settled for _, _, settled in results if settled is not None))
    answered = []
    settled_codes = iter(codes)
    for transactional_id, errors, settled in results:
        code = next(settled_codes) if settled is not None else ErrorCode.none
        if code != ErrorCode.none:
            errors = dict.fromkeys(errors, code)
        answered.append((transactional_id, _by_topic(errors, request.api_version)))
    if request.api_version < FIRST_BATCHED_VERSION:
        return request.respond(throttle_time=0, results_by_topic_v3_and_below=answered[0][1])
    return request.respond(
        throttle_time=0,
        error_code=ErrorCode.none,
        results_by_transaction=[
            {"transactional_id": transactional_id, "topic_results": topics}
            for transactional_id, topics in answered
        ],
    )


def _by_topic(errors: Errors, version: int) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (topic, partition), code in errors.items():
        by_topic[topic].append(
            {
                "partition_index": partition,
                "partition_error_code": for_version(code, version, FIRST_VERSION_WITH_PRODUCER_FENCED),
            }
        )
    return [{"name": topic, "results_by_partition": partitions} for topic, partitions in by_topic.items()]
