"""SyncGroup (14): the leader hands in the assignment; every member waits for its share."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.apis.consumer_groups import resolver, when_committed
from onceflow.broker.coordinator_shards import Shard
from onceflow.broker.core import now_ms
from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import SyncResult
from onceflow.coordinator.group_requests import SyncRequest

API_KEY = 14
MIN_VERSION = 0
MAX_VERSION = 5


def handle(request: Request) -> Any:
    body = request.body
    version = request.api_version
    shard = group_coordinator(request, body.group_id)
    if isinstance(shard, ErrorCode):
        return _respond(request, SyncResult(shard))
    sync = SyncRequest(
        group_id=body.group_id,
        generation_id=body.generation_id,
        member_id=body.member_id,
        group_instance_id=body.group_instance_id if version >= 3 else None,
        protocol_type=body.protocol_type if version >= 5 else None,
        protocol_name=body.protocol_name if version >= 5 else None,
        assignments={entry.member_id: entry.assignment for entry in body.assignments},
    )
    synced: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
    shard.coordinator.sync_group(sync, now_ms(), resolver(synced))
    return _once_synced(request, shard, synced)


async def _once_synced(
    request: Request, shard: Shard[GroupCoordinator], synced: asyncio.Future[SyncResult]
) -> Any:
    result = await synced
    return await when_committed(
        request, shard, _respond(request, result), lambda code: _respond(request, SyncResult(code))
    )


def _respond(request: Request, result: SyncResult) -> Any:
    return request.respond(
        throttle_time=0,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )
