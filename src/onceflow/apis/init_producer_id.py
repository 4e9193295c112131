"""InitProducerId (22) for idempotent producers: a fresh producer id, epoch 0.

Transactional ids belong to the transaction coordinator, which this broker
does not have yet; such requests get COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 4


def handle(request: Request) -> Any:
    transactional_id = request.body.transactional_id
    if transactional_id == "":
        return _error(request, ErrorCode.invalid_request)
    if transactional_id is not None:
        return _error(request, ErrorCode.coordinator_not_available)
    producer_id = request.broker.producer_ids.allocate()
    return request.respond(
        throttle_time=0, error_code=ErrorCode.none, producer_id=producer_id, producer_epoch=0
    )


def _error(request: Request, code: ErrorCode) -> Any:
    return request.respond(throttle_time=0, error_code=code, producer_id=-1, producer_epoch=-1)
