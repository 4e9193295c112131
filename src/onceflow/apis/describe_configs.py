"""DescribeConfigs (32): a topic's configs (its own, else the broker's, else Kafka's defaults)
and the broker's own settings, with their sources, types (v3+) and synonyms when asked. In a
cluster a topic's own configs are those of its config znode, so any broker describes any topic,
also one it holds no replica of."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.broker.described_configs import ConfigEntry, broker_entries, topic_entries
from onceflow.log.config import LogConfig
from onceflow.log.config_checks import ConfigType

API_KEY = 32
MIN_VERSION = 1
MAX_VERSION = 4

TOPIC = 2
BROKER = 4


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
        "configs": [],
    }
    if resource.resource_type == TOPIC:
        name = resource.resource_name
        info = broker.logs.topics.get(name)
        if broker.cluster is not None and name in broker.cluster.view.topics:
            own = broker.cluster.view.topic_configs.get(name, {})
            try:
                effective = LogConfig.from_kafka(own, broker.logs.broker_config)
            except ValueError as error:  # a znode not written by a broker, which checks them
                return {**result, "error_code": ErrorCode.invalid_config, "error_message": str(error)}
        elif info is not None:
            own, effective = info.configs, broker.logs.topic_config(name)
        else:
            return {
                **result,
                "error_code": ErrorCode.unknown_topic_or_partition,
                "error_message": f"unknown topic {name!r}",
            }
        entries = topic_entries(broker.config, own, effective)
    elif resource.resource_type == BROKER:
        if resource.resource_name not in ("", str(broker.node_id)):
            return {
                **result,
                "error_code": ErrorCode.invalid_request,
                "error_message": f"no broker {resource.resource_name!r}",
            }
        entries = broker_entries(broker.config)
    else:
        return {
            **result,
            "error_code": ErrorCode.invalid_request,
            "error_message": f"resource type {resource.resource_type} is not described",
        }
    wanted = resource.configuration_keys
    include_synonyms = bool(getattr(request.body, "include_synonyms", False))
    configs = [
        _entry(entry, read_only=resource.resource_type == BROKER, include_synonyms=include_synonyms)
        for entry in entries
        if not wanted or entry.name in wanted
    ]
    return {**result, "configs": configs}


def _entry(entry: ConfigEntry, read_only: bool, include_synonyms: bool) -> dict[str, Any]:
    # Passwords (a keystore's, a JAAS config's users) are never sent, as Kafka sends none.
    sensitive = entry.type is ConfigType.PASSWORD
    synonyms = [
        {**synonym._asdict(), "value": None if sensitive else synonym.value} for synonym in entry.synonyms
    ]
    return {
        "name": entry.name,
        "value": None if sensitive else entry.value,
        # Broker keys are read from the config file at start-up; only topic configs are dynamic.
        "read_only": read_only,
        "config_source": entry.source,
        "is_sensitive": sensitive,
        "synonyms": synonyms if include_synonyms else [],
        "config_type": int(entry.type),
        "documentation": None,
    }
