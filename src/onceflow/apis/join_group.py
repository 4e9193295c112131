"""JoinGroup (11): join a group, or rejoin it for a rebalance; waits until the rebalance
completes. The leader's answer carries every member's metadata for the assignment."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, coordinator_elsewhere
from onceflow.apis.consumer_groups import milliseconds, resolver, when_durable
from onceflow.broker.core import now_ms
from onceflow.coordinator.group_metadata import JoinResult, Protocol
from onceflow.coordinator.group_requests import JoinRequest

API_KEY = 11
MIN_VERSION = 0
MAX_VERSION = 9


def handle(request: Request) -> Any:
    body = request.body
    version = request.api_version
    if coordinator_elsewhere(request):
        joined_elsewhere: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        joined_elsewhere.set_result(JoinResult(ErrorCode.not_coordinator, body.member_id))
        return _respond(request, joined_elsewhere)
    session_timeout_ms = milliseconds(body.session_timeout)
    join = JoinRequest(
        group_id=body.group_id,
        member_id=body.member_id,
        group_instance_id=body.group_instance_id if version >= 5 else None,
        client_id=request.header.client_id or "",
        client_host="",
        session_timeout_ms=session_timeout_ms,
        # v0 has no rebalance timeout: the session timeout bounds the rebalance.
        rebalance_timeout_ms=milliseconds(body.rebalance_timeout) if version >= 1 else session_timeout_ms,
        protocol_type=body.protocol_type,
        protocols=tuple(Protocol(protocol.name, protocol.metadata) for protocol in body.protocols),
        require_known_member_id=version >= 4,
    )
    joined: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
    request.broker.groups.join_group(join, now_ms(), resolver(joined))
    return _respond(request, joined)


async def _respond(request: Request, joined: asyncio.Future[JoinResult]) -> Any:
    result = await joined
    protocol_name = result.protocol_name
    if request.api_version < 7:  # not nullable before v7
        protocol_name = protocol_name or ""
    response = request.respond(
        throttle_time=0,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=protocol_name,
        leader=result.leader_id,
        skip_assignment=False,
        member_id=result.member_id,
        members=[
            {
                "member_id": member.member_id,
                "group_instance_id": member.group_instance_id,
                "metadata": member.metadata,
            }
            for member in result.members
        ],
    )
    return await when_durable(request, response)
