"""What AlterConfigs (33) and IncrementalAlterConfigs (44) share: which resources can change,
and storing a topic's new set of configs.

Topic configs are dynamic, as in Kafka: checked as CreateTopics checks them (INVALID_CONFIG),
stored in topics.json and applied to the live partitions; DescribeConfigs then reports them as
DYNAMIC_TOPIC_CONFIG. In a cluster the new set goes to the topic's config znode, and the answer
waits for that write; every broker watches the znode and applies it to its own replicas.
Broker keys are static here (read at start-up from --config and --set), so changing one is
INVALID_REQUEST, as Kafka answers for a key that is not dynamically updatable. The
coordinators' logs keep the configs their state depends on (POLICY_VIOLATION).
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Awaitable, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.cluster.errors import ClusterError
from onceflow.coordinator.runtime import is_internal
from onceflow.log.errors import LogError

TOPIC = 2
BROKER = 4


def alter_all(request: Request, alter: Any) -> Any:
    """The response: `alter(request, resource, validate_only)` for each resource, but
    INVALID_REQUEST for a resource named twice in the request, as Kafka. Once any result is
    awaitable (a write to ZooKeeper), the response waits for all of them."""
    resources = request.body.resources
    named = Counter((resource.resource_type, resource.resource_name) for resource in resources)
    responses = []
    for resource in resources:
        if named[resource.resource_type, resource.resource_name] > 1:
            responses.append(
                result(
                    resource, ErrorCode.invalid_request, f"resource {resource.resource_name!r} given twice"
                )
            )
        else:
            responses.append(alter(request, resource, request.body.validate_only))
    if any(inspect.isawaitable(response) for response in responses):
        return _respond_when_written(request, responses)
    return request.respond(throttle_time=0, responses=responses)


async def _respond_when_written(request: Request, responses: list[Any]) -> Any:
    written = [await response if inspect.isawaitable(response) else response for response in responses]
    return request.respond(throttle_time=0, responses=written)


def result(resource: Any, error: ErrorCode = ErrorCode.none, message: str | None = None) -> dict[str, Any]:
    return {
        "error_code": error,
        "error_message": message,
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
    }


def resource_problem(request: Request, resource: Any) -> dict[str, Any] | None:
    """The answer for a resource whose configs cannot change, or None for an existing topic."""
    broker = request.broker
    names = [config.name for config in resource.configs]
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        return result(resource, ErrorCode.invalid_request, f"duplicate config keys: {', '.join(duplicates)}")
    if resource.resource_type == BROKER:
        if resource.resource_name not in ("", str(broker.node_id)):
            return result(resource, ErrorCode.invalid_request, f"no broker {resource.resource_name!r}")
        if names:
            return result(
                resource,
                ErrorCode.invalid_request,
                f"cannot update these configs dynamically: {', '.join(sorted(names))} "
                "(this broker's configs are static: set them with --config or --set at start-up)",
            )
        return result(resource)
    if resource.resource_type != TOPIC:
        return result(
            resource,
            ErrorCode.invalid_request,
            f"resource type {resource.resource_type} has no alterable configs",
        )
    name = resource.resource_name
    if name not in broker.metadata.topics:
        return result(resource, ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
    if is_internal(name):
        return result(
            resource, ErrorCode.policy_violation, f"{name} is a coordinator's log; its configs are fixed"
        )
    return None


def null_value(resource: Any) -> dict[str, Any] | None:
    """Kafka refuses a null value to set (INVALID_REQUEST)."""
    nulls = [config.name for config in resource.configs if config.value is None]
    if nulls:
        return result(
            resource, ErrorCode.invalid_request, f"null value not supported for: {', '.join(nulls)}"
        )
    return None


def topic_configs(request: Request, name: str) -> dict[str, str]:
    """The topic's own configs, as the cluster's metadata has them (in a cluster its config
    znode, last read: this broker may hold no replica of it)."""
    return dict(request.broker.metadata.topic_configs.get(name, {}))


def store_topic_configs(
    request: Request, resource: Any, configs: Mapping[str, str], validate_only: bool
) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    logs = request.broker.logs
    try:
        if request.broker.cluster is not None or validate_only:
            logs.check_topic_configs(configs)
        else:
            logs.alter_topic_configs(resource.resource_name, configs)
    except LogError as error:
        return result(resource, error.error_code, str(error))
    if request.broker.cluster is not None and not validate_only:
        return _store_in_cluster(request, resource, configs)
    return result(resource)


async def _store_in_cluster(request: Request, resource: Any, configs: Mapping[str, str]) -> dict[str, Any]:
    cluster = request.broker.cluster
    assert cluster is not None
    try:
        await cluster.set_topic_configs(resource.resource_name, configs)
    except ClusterError as error:
        return result(resource, ErrorCode.unknown_server_error, str(error))
    return result(resource)
