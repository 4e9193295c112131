"""CreateTopics (19)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.broker.described_configs import topic_entries
from onceflow.log.errors import LogError

API_KEY = 19
MIN_VERSION = 2
MAX_VERSION = 7


def handle(request: Request) -> Any:
    body = request.body
    return request.respond(
        throttle_time=0, topics=[_create(request, topic, body.validate_only) for topic in body.topics]
    )


def _create(request: Request, topic: Any, validate_only: bool) -> dict[str, Any]:
    broker = request.broker
    name = topic.name
    partitions = topic.num_partitions
    if topic.assignments:
        if partitions != -1:
            return _failed(name, ErrorCode.invalid_request, "give either num_partitions or assignments")
        partitions = len(topic.assignments)
    if partitions == -1:
        partitions = broker.config.get_int("num.partitions")
    if topic.replication_factor not in (-1, 1):
        return _failed(
            name,
            ErrorCode.invalid_replication_factor,
            f"replication factor {topic.replication_factor} is larger than the 1 available broker",
        )
    configs = {config.name: config.value for config in topic.configs if config.value is not None}
    if name in broker.logs.topics:
        return _failed(name, ErrorCode.topic_already_exists, f"topic {name!r} already exists")
    try:
        if validate_only:
            effective = broker.logs.validate_new_topic(name, partitions, configs)
            info_id = None
        else:
            info_id = broker.logs.create_topic(name, partitions, configs).topic_id
            effective = broker.logs.topic_config(name)
    except LogError as error:
        return _failed(name, error.error_code, str(error))
    return {
        "name": name,
        "topic_id": info_id,
        "error_code": ErrorCode.none,
        "error_message": None,
        "num_partitions": partitions,
        "replication_factor": 1,
        # v5+: the new topic's configs, as DescribeConfigs would report them.
        "configs": [
            {
                "name": entry.name,
                "value": entry.value,
                "read_only": False,
                "config_source": entry.source,
                "is_sensitive": False,
            }
            for entry in topic_entries(broker.config, configs, effective)
        ],
    }


def _failed(name: str, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"name": name, "topic_id": None, "error_code": code, "error_message": message, "configs": []}
