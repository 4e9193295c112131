"""IncrementalAlterConfigs (44): SET, DELETE, APPEND and SUBTRACT on a topic's own configs,
as Kafka's ConfigAdminManager: APPEND and SUBTRACT work on list-typed keys only and start from
the topic's value, else the default; DELETE of a key that is not set changes nothing. A list
may end up empty (`cleanup.policy` without delete or compact keeps everything)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.apis.config_changes import (
    alter_all,
    resource_problem,
    result,
    store_topic_configs,
    topic_configs,
)
from onceflow.log.config_checks import ConfigType
from onceflow.log.topic_configs import TOPIC_KEYS

API_KEY = 44
MIN_VERSION = 0
MAX_VERSION = 1

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OPERATION_NAMES = {APPEND: "append", SUBTRACT: "subtract"}


def handle(request: Request) -> Any:
    return alter_all(request, _alter)


def _alter(
    request: Request, resource: Any, validate_only: bool
) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    problem = resource_problem(request, resource)
    if problem is not None:
        return problem
    configs = topic_configs(request, resource.resource_name)
    for change in resource.configs:
        name, operation, value = change.name, change.config_operation, change.value
        if operation not in (SET, DELETE, APPEND, SUBTRACT):
            return result(
                resource, ErrorCode.invalid_request, f"unknown config operation {operation} for {name}"
            )
        if operation == DELETE:
            configs.pop(name, None)
            continue
        if value is None:
            return result(resource, ErrorCode.invalid_request, f"null value not supported for: {name}")
        if operation == SET:
            configs[name] = value
            continue
        key = TOPIC_KEYS.get(name)
        if key is None:
            return result(resource, ErrorCode.invalid_config, f"Unknown topic config name: {name}")
        if key.type is not ConfigType.LIST:
            return result(
                resource,
                ErrorCode.invalid_config,
                f"Config value {_OPERATION_NAMES[operation]} is not allowed for config key: {name}",
            )
        # Unset, a key the broker sets the default of starts from the broker's value.
        default = key.default if key.broker_key is None else request.broker.config.get(key.broker_key)
        current = _items(configs.get(name, default))
        given = _items(value)
        if operation == APPEND:
            updated = current + [item for item in given if item not in current]
        else:
            updated = [item for item in current if item not in given]
        configs[name] = ",".join(updated)
    return store_topic_configs(request, resource, configs, validate_only)


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]
