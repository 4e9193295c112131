"""LeaveGroup (13): members leave (v3+: several, also by group.instance.id alone)."""

from __future__ import annotations

from functools import partial
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.apis.consumer_groups import when_committed
from onceflow.broker.core import now_ms
from onceflow.coordinator.group_requests import MemberIdentity

API_KEY = 13
MIN_VERSION = 0
MAX_VERSION = 5


def handle(request: Request) -> Any:
    body = request.body
    shard = group_coordinator(request, body.group_id)
    if isinstance(shard, ErrorCode):
        return _refused(request, shard)
    if request.api_version >= 3:
        leaving = [MemberIdentity(member.member_id, member.group_instance_id) for member in body.members]
    else:
        leaving = [MemberIdentity(body.member_id, None)]
    error, member_errors = shard.coordinator.leave_group(body.group_id, leaving, now_ms())
    if error != ErrorCode.none:
        return _refused(request, error)
    if request.api_version < 3:
        error = member_errors[0]  # one member, reported as the request's error
    members = [
        {"member_id": member_id, "group_instance_id": group_instance_id, "error_code": member_error}
        for (member_id, group_instance_id), member_error in zip(leaving, member_errors, strict=True)
    ]
    response = request.respond(throttle_time=0, error_code=error, members=members)
    return when_committed(request, shard, response, partial(_refused, request))


def _refused(request: Request, code: ErrorCode) -> Any:
    return request.respond(throttle_time=0, error_code=code, members=[])
