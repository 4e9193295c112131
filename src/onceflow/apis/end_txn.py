"""EndTxn (26): commit or abort. Prepare* is made durable, then the markers, then Complete*.

The answer comes once the markers are committed, so a producer's next transaction never
meets CONCURRENT_TRANSACTIONS from its own previous one. v5 answers the producer id and epoch
the next transaction uses (KIP-890): under transaction version 1, as here, the same ones.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, for_version, once_settled, transaction_coordinator
from onceflow.broker.core import now_ms

API_KEY = 26
MIN_VERSION = 0
MAX_VERSION = 5
FIRST_VERSION_WITH_PRODUCER_FENCED = 2


def handle(request: Request) -> Any:
    body = request.body
    shard = transaction_coordinator(request, body.transactional_id)
    if isinstance(shard, ErrorCode):
        return _answer(request, shard)
    reply = shard.coordinator.end_transaction(
        body.transactional_id, body.producer_id, body.producer_epoch, body.committed, now_ms()
    )
    answer = _answer(
        request,
        for_version(reply.reply, request.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED),
        body.producer_id,
        body.producer_epoch,
    )
    return once_settled(request, shard, reply, answer, partial(_answer, request))


def _answer(request: Request, code: ErrorCode, producer_id: int = -1, producer_epoch: int = -1) -> Any:
    succeeded = code == ErrorCode.none
    return request.respond(
        throttle_time=0,
        error_code=code,
        producer_id=producer_id if succeeded else -1,
        producer_epoch=producer_epoch if succeeded else -1,
    )
