"""OffsetCommit (8): store a group's consumed positions. v9 is v8 for the classic groups this
broker has: KIP-848's member epoch, for them, is the generation."""

from __future__ import annotations

from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.apis.consumer_groups import commit_results, every_partition, requested_offsets, when_committed
from onceflow.broker.core import now_ms

API_KEY = 8
MIN_VERSION = 2
MAX_VERSION = 9


def handle(request: Request) -> Any:
    body = request.body
    shard = group_coordinator(request, body.group_id)
    if isinstance(shard, ErrorCode):
        return _refused(request, shard)
    now = now_ms()
    errors = shard.coordinator.commit_offsets(
        body.group_id,
        body.generation_id_or_member_epoch,
        body.member_id,
        body.group_instance_id if request.api_version >= 7 else None,
        requested_offsets(body.topics, now),
        now,
    )
    response = request.respond(throttle_time=0, topics=commit_results(body.topics, errors))
    return when_committed(request, shard, response, partial(_refused, request))


def _refused(request: Request, code: ErrorCode) -> Any:
    """Every partition of the request answered `code`."""
    topics = request.body.topics
    return request.respond(throttle_time=0, topics=commit_results(topics, every_partition(topics, code)))
