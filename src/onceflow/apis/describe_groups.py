"""DescribeGroups (15): state, protocol and members of groups. A group that does not exist is
Dead; from v6 (KIP-1043) it is also GROUP_ID_NOT_FOUND."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.coordinator.group_metadata import GroupState

API_KEY = 15
MIN_VERSION = 0
MAX_VERSION = 6


def handle(request: Request) -> Any:
    return request.respond(
        throttle_time=0, groups=[_describe(request, group_id) for group_id in request.body.groups]
    )


def _describe(request: Request, group_id: str) -> dict[str, Any]:
    shard = group_coordinator(request, group_id)
    if isinstance(shard, ErrorCode):
        return {
            "error_code": shard,
            "group_id": group_id,
            "group_state": "",
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
        }
    description = shard.coordinator.describe_group(group_id)
    if description is None:
        not_found = request.api_version >= 6
        return {
            "error_code": ErrorCode.group_id_not_found if not_found else ErrorCode.none,
            "error_message": f"group {group_id!r} not found" if not_found else None,
            "group_id": group_id,
            "group_state": GroupState.DEAD.value,
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
        }
    return {
        "error_code": ErrorCode.none,
        "group_id": group_id,
        "group_state": description.state.value,
        "protocol_type": description.protocol_type,
        "protocol_data": description.protocol_name,
        "members": [
            {
                "member_id": member.member_id,
                "group_instance_id": member.group_instance_id,
                "client_id": member.client_id,
                "client_host": member.client_host,
                "member_metadata": member.metadata,
                "member_assignment": member.assignment,
            }
            for member in description.members
        ],
    }
