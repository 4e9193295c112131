"""OffsetCommit (8): store a group's consumed positions (v9+ needs KIP-848 member epochs)."""

from __future__ import annotations

from typing import Any

from onceflow.apis.common import Request
from onceflow.apis.consumer_groups import commit_results, requested_offsets, when_durable
from onceflow.broker.core import now_ms

API_KEY = 8
MIN_VERSION = 2
MAX_VERSION = 8


def handle(request: Request) -> Any:
    body = request.body
    now = now_ms()
    errors = request.broker.groups.commit_offsets(
        body.group_id,
        body.generation_id_or_member_epoch,
        body.member_id,
        body.group_instance_id if request.api_version >= 7 else None,
        requested_offsets(body.topics, now),
        now,
    )
    response = request.respond(throttle_time=0, topics=commit_results(body.topics, errors))
    return when_durable(request, response)
