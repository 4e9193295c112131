"""DeleteGroups (42): remove empty groups and their committed offsets."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, coordinator_elsewhere
from onceflow.apis.consumer_groups import when_durable
from onceflow.broker.core import now_ms

API_KEY = 42
MIN_VERSION = 0
MAX_VERSION = 2


def handle(request: Request) -> Any:
    names = request.body.groups_names
    if coordinator_elsewhere(request):
        refused = [{"group_id": name, "error_code": ErrorCode.not_coordinator} for name in names]
        return request.respond(throttle_time=0, results=refused)
    errors = request.broker.groups.delete_groups(names, now_ms())
    response = request.respond(
        throttle_time=0, results=[{"group_id": name, "error_code": errors[name]} for name in names]
    )
    return when_durable(request, response)
