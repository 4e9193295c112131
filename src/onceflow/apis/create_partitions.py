"""CreatePartitions (37): grow a topic's partition count."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, single_broker_only
from onceflow.log.errors import LogError

API_KEY = 37
MIN_VERSION = 0
MAX_VERSION = 3


def handle(request: Request) -> Any:
    body = request.body
    logs = request.broker.logs
    results = []
    refused = single_broker_only(request, "CreatePartitions")
    for topic in body.topics:
        if refused is not None:
            results.append(
                {"name": topic.name, "error_code": ErrorCode.policy_violation, "error_message": refused}
            )
            continue
        try:
            if body.validate_only:
                logs.validate_new_partition_count(topic.name, topic.count)
            else:
                logs.create_partitions(topic.name, topic.count)
        except LogError as error:
            results.append({"name": topic.name, "error_code": error.error_code, "error_message": str(error)})
            continue
        results.append({"name": topic.name, "error_code": ErrorCode.none})
    return request.respond(throttle_time=0, results=results)
