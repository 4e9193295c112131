"""Heartbeat (12): a member is alive; REBALANCE_IN_PROGRESS tells it to rejoin."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.broker.core import now_ms

API_KEY = 12
MIN_VERSION = 0
MAX_VERSION = 4


def handle(request: Request) -> Any:
    body = request.body
    shard = group_coordinator(request, body.group_id)
    if isinstance(shard, ErrorCode):
        return request.respond(throttle_time=0, error_code=shard)
    error = shard.coordinator.heartbeat(
        body.group_id,
        body.member_id,
        body.group_instance_id if request.api_version >= 3 else None,
        body.generation_id,
        now_ms(),
    )
    return request.respond(throttle_time=0, error_code=error)
