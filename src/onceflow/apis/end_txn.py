"""EndTxn (26): commit or abort. Prepare* is made durable, then the markers, then Complete*.

The answer comes once the markers are durable, so a producer's next transaction never
meets CONCURRENT_TRANSACTIONS from its own previous one. v5 answers the producer id and epoch
the next transaction uses (KIP-890): under transaction version 1, as here, the same ones.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, coordinator_elsewhere, for_version, once_settled
from onceflow.broker.core import now_ms

API_KEY = 26
MIN_VERSION = 0
MAX_VERSION = 5
FIRST_VERSION_WITH_PRODUCER_FENCED = 2


def handle(request: Request) -> Any:
    body = request.body
    if coordinator_elsewhere(request):
        return request.respond(throttle_time=0, error_code=ErrorCode.not_coordinator)
    reply = request.broker.transactions.end_transaction(
        body.transactional_id, body.producer_id, body.producer_epoch, body.committed, now_ms()
    )
    succeeded = reply.reply == ErrorCode.none
    answer = request.respond(
        throttle_time=0,
        error_code=for_version(reply.reply, request.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED),
        producer_id=body.producer_id if succeeded else -1,
        producer_epoch=body.producer_epoch if succeeded else -1,
    )
    return once_settled(request, reply, answer)
