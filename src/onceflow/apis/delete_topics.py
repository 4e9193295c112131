"""DeleteTopics (20): by name (v0-5) or by name or topic id (v6). In a cluster the topic is
marked for deletion in ZooKeeper and the answer waits until the controller deleted it."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, topic_name
from onceflow.cluster.errors import ClusterError
from onceflow.coordinator.runtime import is_internal
from onceflow.log.errors import LogError

API_KEY = 20
MIN_VERSION = 1
MAX_VERSION = 6


def handle(request: Request) -> Any:
    return _delete_all(request)


async def _delete_all(request: Request) -> Any:
    responses = []
    for name, topic_id in _wanted(request):
        if name is None:
            responses.append({"name": None, "topic_id": topic_id, "error_code": ErrorCode.unknown_topic_id})
        elif is_internal(name):
            message = f"{name} is a coordinator's log and cannot be deleted"
            responses.append(_failed(name, topic_id, ErrorCode.invalid_topic_exception, message))
        elif request.broker.cluster is not None:
            responses.append(await _delete_in_cluster(request, name, topic_id))
        else:
            responses.append(_delete(request, name, topic_id))
    return request.respond(throttle_time=0, responses=responses)


def _delete(request: Request, name: str, topic_id: Any) -> dict[str, Any]:
    logs = request.broker.logs
    info = logs.topics.get(name)
    try:
        logs.delete_topic(name)
    except LogError as error:
        return _failed(name, topic_id, error.error_code, str(error))
    return {"name": name, "topic_id": info.topic_id if info else topic_id, "error_code": ErrorCode.none}


async def _delete_in_cluster(request: Request, name: str, topic_id: Any) -> dict[str, Any]:
    cluster = request.broker.cluster
    assert cluster is not None
    assignment = cluster.view.topics.get(name)
    if assignment is None:
        return _failed(name, topic_id, ErrorCode.unknown_topic_or_partition, f"unknown topic '{name}'")
    try:
        deleted = await cluster.delete_topic(name, request.body.timeout.total_seconds())
    except ClusterError as error:
        return _failed(name, topic_id, ErrorCode.unknown_server_error, str(error))
    if not deleted:
        message = "the topic is marked for deletion but not deleted yet"
        return _failed(name, topic_id, ErrorCode.request_timed_out, message)
    return {"name": name, "topic_id": assignment.topic_id, "error_code": ErrorCode.none}


def _wanted(request: Request) -> list[tuple[str | None, Any]]:
    """(name, topic id) of each topic the request names; the name None for an unknown id."""
    body = request.body
    if request.api_version < 6:
        return [(name, None) for name in body.topic_names]
    return [
        (topic.name or topic_name(request, None, topic.topic_id, 6), topic.topic_id) for topic in body.topics
    ]


def _failed(name: str, topic_id: Any, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"name": name, "topic_id": topic_id, "error_code": code, "error_message": message}
