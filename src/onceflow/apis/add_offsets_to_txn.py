"""AddOffsetsToTxn (25): a consumer group's offsets join the producer's transaction."""

from __future__ import annotations

from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, for_version, once_settled, transaction_coordinator
from onceflow.broker.core import now_ms

API_KEY = 25
MIN_VERSION = 0
MAX_VERSION = 4  # v4 is v3 (KIP-890 error codes)
FIRST_VERSION_WITH_PRODUCER_FENCED = 2


def handle(request: Request) -> Any:
    body = request.body
    shard = transaction_coordinator(request, body.transactional_id)
    if isinstance(shard, ErrorCode):
        return _answer(request, shard)
    reply = shard.coordinator.add_offsets(
        body.transactional_id, body.producer_id, body.producer_epoch, body.group_id, now_ms()
    )
    answer = _answer(
        request, for_version(reply.reply, request.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED)
    )
    return once_settled(request, shard, reply, answer, partial(_answer, request))


def _answer(request: Request, code: ErrorCode) -> Any:
    return request.respond(throttle_time=0, error_code=code)
