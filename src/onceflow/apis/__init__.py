"""One module per Kafka API (after franz-go's kfake).

Each module has API_KEY, MIN_VERSION, MAX_VERSION and
`handle(request: Request) -> Reply`. A reply is a kio response entity, an
awaitable of one (the handler has to wait, e.g. for fsync or a long poll),
or None when Kafka sends no response (Produce with acks=0).
"""

from __future__ import annotations

from collections.abc import Awaitable
from types import ModuleType
from typing import Any

from onceflow.apis import (
    api_versions,
    create_partitions,
    create_topics,
    delete_topics,
    describe_configs,
    fetch,
    find_coordinator,
    init_producer_id,
    list_offsets,
    metadata,
    offset_for_leader_epoch,
    produce,
)
from onceflow.apis.common import Request, VersionRange

Reply = Any | Awaitable[Any] | None

_MODULES: tuple[ModuleType, ...] = (
    produce,
    fetch,
    list_offsets,
    metadata,
    api_versions,
    create_topics,
    delete_topics,
    init_producer_id,
    offset_for_leader_epoch,
    describe_configs,
    create_partitions,
    find_coordinator,
)
HANDLERS: dict[int, ModuleType] = {module.API_KEY: module for module in _MODULES}
SUPPORTED_VERSIONS: dict[int, VersionRange] = {
    module.API_KEY: VersionRange(module.MIN_VERSION, module.MAX_VERSION) for module in _MODULES
}


def is_supported(api_key: int, api_version: int) -> bool:
    versions = SUPPORTED_VERSIONS.get(api_key)
    return versions is not None and versions.min <= api_version <= versions.max


def dispatch(request: Request) -> Reply:
    return HANDLERS[request.api_key].handle(request)


__all__ = ["HANDLERS", "SUPPORTED_VERSIONS", "Reply", "Request", "dispatch", "is_supported"]
