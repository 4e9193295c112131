"""FindCoordinator (10): this single broker coordinates every group and transactional id."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request

API_KEY = 10
MIN_VERSION = 0
MAX_VERSION = 4

KEY_TYPES = (0, 1)  # group, transaction


def handle(request: Request) -> Any:
    body = request.body
    endpoint = request.broker.endpoint
    key_type = getattr(body, "key_type", 0)
    if key_type in KEY_TYPES:
        found: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "node_id": endpoint.node_id,
            "host": endpoint.host,
            "port": endpoint.port,
        }
    else:
        found = {
            "error_code": ErrorCode.invalid_request,
            "error_message": f"unknown key type {key_type}",
            "node_id": -1,
            "host": "",
            "port": -1,
        }
    if request.api_version >= 4:
        return request.respond(
            throttle_time=0, coordinators=[{"key": key, **found} for key in body.coordinator_keys]
        )
    return request.respond(throttle_time=0, **found)
