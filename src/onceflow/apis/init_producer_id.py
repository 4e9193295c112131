"""InitProducerId (22): a producer id for idempotent producers, or a transactional session.

Without a transactional id every call gets a fresh producer id at epoch 0. With one, the
transaction coordinator bumps the epoch, which fences the previous session (KIP-360 rules),
and the answer waits until that is durable. In a cluster, while the next block of producer ids
has not come from ZooKeeper, the answer is COORDINATOR_LOAD_IN_PROGRESS (Kafka's, retriable).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, for_version, once_settled, transaction_coordinator
from onceflow.broker.core import now_ms

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 5  # v5 is v4 (KIP-890 error codes)
FIRST_VERSION_WITH_PRODUCER_FENCED = 4


def handle(request: Request) -> Any:
    body = request.body
    transactional_id = body.transactional_id
    if transactional_id == "":
        return _answer(request, ErrorCode.invalid_request)
    broker = request.broker
    shard = None
    if transactional_id is not None:
        found = transaction_coordinator(request, transactional_id)
        if isinstance(found, ErrorCode):
            return _answer(request, found)
        shard = found
    if not broker.producer_ids.ready():
        # The next block of ids has to come from ZooKeeper: the client asks again, and the
        # event loop never waits for ZooKeeper meanwhile.
        return _answer(request, ErrorCode.coordinator_load_in_progress)
    if shard is None:
        return _answer(request, ErrorCode.none, broker.producer_ids.allocate(), 0)
    reply = shard.coordinator.init_producer_id(
        transactional_id,
        int(body.transaction_timeout.total_seconds() * 1000),
        getattr(body, "producer_id", -1),
        getattr(body, "producer_epoch", -1),
        now_ms(),
    )
    result = reply.reply
    answer = _answer(
        request,
        for_version(result.error, request.api_version, FIRST_VERSION_WITH_PRODUCER_FENCED),
        result.producer_id,
        result.producer_epoch,
    )
    return once_settled(request, shard, reply, answer, partial(_answer, request))


def _answer(request: Request, code: ErrorCode, producer_id: int = -1, producer_epoch: int = -1) -> Any:
    return request.respond(
        throttle_time=0, error_code=code, producer_id=producer_id, producer_epoch=producer_epoch
    )
