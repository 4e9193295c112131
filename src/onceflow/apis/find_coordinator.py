"""FindCoordinator (10): this single broker coordinates every group and transactional id.

In a cluster, the coordinators' internal topics live on one broker, the live one with the
lowest id (`ClusterView.coordinator_id`), so every key is answered with that broker."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request

API_KEY = 10
MIN_VERSION = 0
MAX_VERSION = 6  # v5 and v6 are v4; v6's key type 2 (share groups) is INVALID_REQUEST here

KEY_TYPES = (0, 1)  # group, transaction


def handle(request: Request) -> Any:
    body = request.body
    key_type = getattr(body, "key_type", 0)
    coordinator = _coordinator(request)
    if key_type not in KEY_TYPES:
        found = _not_found(ErrorCode.invalid_request, f"unknown key type {key_type}")
    elif coordinator is None:
        found = _not_found(ErrorCode.coordinator_not_available, "no broker is live in the cluster")
    else:
        node_id, host, port = coordinator
        found = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "node_id": node_id,
            "host": host,
            "port": port,
        }
    if request.api_version >= 4:
        return request.respond(
            throttle_time=0, coordinators=[{"key": key, **found} for key in body.coordinator_keys]
        )
    return request.respond(throttle_time=0, **found)


def _coordinator(request: Request) -> tuple[int, str, int] | None:
    broker = request.broker
    if broker.cluster is None:
        return broker.endpoint.node_id, broker.endpoint.host, broker.endpoint.port
    view = broker.cluster.view
    registration = view.brokers.get(view.coordinator_id)
    if registration is None:
        return None
    return registration.broker_id, registration.host, registration.port


def _not_found(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "node_id": -1, "host": "", "port": -1}
