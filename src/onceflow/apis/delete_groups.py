"""DeleteGroups (42): remove empty groups and their committed offsets."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, group_coordinator
from onceflow.broker.coordinator_shards import Shard
from onceflow.broker.core import now_ms
from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.runtime import write_error

API_KEY = 42
MIN_VERSION = 0
MAX_VERSION = 2


def handle(request: Request) -> Any:
    names = request.body.groups_names
    errors: dict[str, ErrorCode] = {}
    written: dict[int, Shard[GroupCoordinator]] = {}  # the coordinators that wrote, by partition
    for name in names:
        shard = group_coordinator(request, name)
        if isinstance(shard, ErrorCode):
            errors[name] = shard
            continue
        errors[name] = shard.coordinator.delete_groups([name], now_ms())[name]
        written[shard.partition] = shard
    return _once_committed(request, names, errors, list(written.values()))


async def _once_committed(
    request: Request, names: list[str], errors: dict[str, ErrorCode], written: list[Shard[GroupCoordinator]]
) -> Any:
    """The answer once each coordinator's deletions are committed; the groups of one whose were
    not answer why."""
    timeout_s = request.broker.config.get_int("offsets.commit.timeout.ms") / 1000
    for shard in written:
        code = await request.broker.wait_committed([shard.coordinator.log], timeout_s)
        if code == ErrorCode.none:
            continue
        for name in names:
            if request.broker.groups.partition_of(name) == shard.partition and errors[name] == ErrorCode.none:
                errors[name] = write_error(code)
    return request.respond(
        throttle_time=0, results=[{"group_id": name, "error_code": errors[name]} for name in names]
    )
