"""AlterConfigs (33): replace the whole set of a topic's own configs (Kafka's semantics: a key
left out goes back to its default). See config_changes for what can change."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from onceflow.apis.common import Request
from onceflow.apis.config_changes import alter_all, null_value, resource_problem, store_topic_configs

API_KEY = 33
MIN_VERSION = 0
MAX_VERSION = 2


def handle(request: Request) -> Any:
    return alter_all(request, _alter)


def _alter(
    request: Request, resource: Any, validate_only: bool
) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    problem = resource_problem(request, resource) or null_value(resource)
    if problem is not None:
        return problem
    configs = {config.name: config.value for config in resource.configs}
    return store_topic_configs(request, resource, configs, validate_only)
