"""JoinGroup (11): join a group, or rejoin it for a rebalance; waits until the rebalance
completes. The leader's answer carries every member's metadata for the assignment."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.apis.consumer_groups import milliseconds, resolver, when_committed
from onceflow.broker.coordinator_shards import Shard
from onceflow.broker.core import now_ms
from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import JoinResult, Protocol
from onceflow.coordinator.group_requests import JoinRequest

API_KEY = 11
MIN_VERSION = 0
MAX_VERSION = 9


def handle(request: Request) -> Any:
    body = request.body
    version = request.api_version
    shard = group_coordinator(request, body.group_id)
    if isinstance(shard, ErrorCode):
        return _respond(request, JoinResult(shard, body.member_id))
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
    shard.coordinator.join_group(join, now_ms(), resolver(joined))
    return _once_joined(request, shard, joined)


async def _once_joined(
    request: Request, shard: Shard[GroupCoordinator], joined: asyncio.Future[JoinResult]
) -> Any:
    result = await joined
    refused = partial(_refused, request, result.member_id)
    return await when_committed(request, shard, _respond(request, result), refused)


def _refused(request: Request, member_id: str, code: ErrorCode) -> Any:
    return _respond(request, JoinResult(code, member_id))


def _respond(request: Request, result: JoinResult) -> Any:
    protocol_name = result.protocol_name
    if request.api_version < 7:  # not nullable before v7
        protocol_name = protocol_name or ""
    return request.respond(
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
