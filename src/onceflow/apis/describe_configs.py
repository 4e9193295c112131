"""DescribeConfigs (32): effective topic configs and the broker's own settings."""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.broker.config import DEFAULTS

API_KEY = 32
MIN_VERSION = 1
MAX_VERSION = 4

TOPIC = 2
BROKER = 4
# config_source values in the response
TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# LogConfig field -> topic-level Kafka key
_TOPIC_KEYS = {
    "segment_bytes": "segment.bytes",
    "index_interval_bytes": "index.interval.bytes",
    "retention_ms": "retention.ms",
    "retention_bytes": "retention.bytes",
    "max_message_bytes": "max.message.bytes",
}


def handle(request: Request) -> Any:
    return request.respond(
        throttle_time=0, results=[_describe(request, resource) for resource in request.body.resources]
    )


def _describe(request: Request, resource: Any) -> dict[str, Any]:
    broker = request.broker
    result: dict[str, Any] = {
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
        "error_code": ErrorCode.none,
        "error_message": None,
    }
    if resource.resource_type == TOPIC:
        info = broker.logs.topics.get(resource.resource_name)
        if info is None:
            return {**result, "error_code": ErrorCode.unknown_topic_or_partition, "configs": []}
        effective = dataclasses.asdict(broker.logs.topic_config(info.name))
        entries = {
            key: (str(effective[field]), TOPIC_CONFIG if key in info.configs else DEFAULT_CONFIG)
            for field, key in _TOPIC_KEYS.items()
        }
        entries["min.insync.replicas"] = (
            info.configs.get("min.insync.replicas", broker.config.get("min.insync.replicas")),
            TOPIC_CONFIG if "min.insync.replicas" in info.configs else DEFAULT_CONFIG,
        )
    elif resource.resource_type == BROKER:
        if resource.resource_name not in ("", str(broker.node_id)):
            return {
                **result,
                "error_code": ErrorCode.invalid_request,
                "configs": [],
                "error_message": f"no broker {resource.resource_name!r}",
            }
        entries = {
            key: (
                broker.config.get(key),
                STATIC_BROKER_CONFIG if key in broker.config.props else DEFAULT_CONFIG,
            )
            for key in sorted({*DEFAULTS, *broker.config.props})
        }
    else:
        return {
            **result,
            "error_code": ErrorCode.invalid_request,
            "configs": [],
            "error_message": f"resource type {resource.resource_type} is not described",
        }
    wanted = resource.configuration_keys
    configs = [
        {
            "name": key,
            "value": value,
            "read_only": resource.resource_type == BROKER,
            "config_source": source,
            "is_sensitive": False,
            "synonyms": [],
            "documentation": None,
        }
        for key, (value, source) in sorted(entries.items())
        if not wanted or key in wanted
    ]
    return {**result, "configs": configs}
