"""DeleteTopics (20): by name (v0-5) or by name or topic id (v6)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, is_internal, single_broker_only
from onceflow.log.errors import LogError

API_KEY = 20
MIN_VERSION = 1
MAX_VERSION = 6


def handle(request: Request) -> Any:
    body = request.body
    logs = request.broker.logs
    if request.api_version >= 6:
        by_id = {info.topic_id: name for name, info in logs.topics.items()}
        wanted = [(topic.name or by_id.get(topic.topic_id), topic.topic_id) for topic in body.topics]
    else:
        wanted = [(name, None) for name in body.topic_names]
    responses = []
    refused = single_broker_only(request, "DeleteTopics")
    for name, topic_id in wanted:
        if refused is not None:
            responses.append(
                {
                    "name": name,
                    "topic_id": topic_id,
                    "error_code": ErrorCode.policy_violation,
                    "error_message": refused,
                }
            )
            continue
        if name is None:
            responses.append({"name": None, "topic_id": topic_id, "error_code": ErrorCode.unknown_topic_id})
            continue
        if is_internal(name):
            responses.append(
                {
                    "name": name,
                    "topic_id": topic_id,
                    "error_code": ErrorCode.invalid_topic_exception,
                    "error_message": f"{name} is a coordinator's log and cannot be deleted",
                }
            )
            continue
        info = logs.topics.get(name)
        try:
            logs.delete_topic(name)
        except LogError as error:
            responses.append(
                {
                    "name": name,
                    "topic_id": topic_id,
                    "error_code": error.error_code,
                    "error_message": str(error),
                }
            )
            continue
        responses.append(
            {"name": name, "topic_id": info.topic_id if info else topic_id, "error_code": ErrorCode.none}
        )
    return request.respond(throttle_time=0, responses=responses)
