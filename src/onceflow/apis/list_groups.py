"""ListGroups (16): every group, optionally filtered by state (v4+) and type (v5+)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request

API_KEY = 16
MIN_VERSION = 0
MAX_VERSION = 5

GROUP_TYPE = "classic"  # the only group protocol here (no KIP-848 consumer groups)


def handle(request: Request) -> Any:
    body = request.body
    states = {state.lower() for state in getattr(body, "states_filter", ())}
    types = {group_type.lower() for group_type in getattr(body, "types_filter", ())}
    # The groups this broker coordinates, as Kafka's brokers list them: an admin client asks
    # every broker. While it loads a partition the list would be short: retry then.
    shards = request.broker.groups
    if shards.loading:
        return request.respond(throttle_time=0, error_code=ErrorCode.coordinator_load_in_progress, groups=[])
    listed = (
        []
        if types and GROUP_TYPE not in types
        else [listing for shard in shards.loaded() for listing in shard.coordinator.list_groups()]
    )
    groups = [
        {
            "group_id": group.group_id,
            "protocol_type": group.protocol_type,
            "group_state": group.state.value,
            "group_type": GROUP_TYPE,
        }
        for group in listed
        if not states or group.state.value.lower() in states
    ]
    return request.respond(throttle_time=0, error_code=ErrorCode.none, groups=groups)
