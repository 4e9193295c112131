"""One module per Kafka API (after franz-go's kfake).

Each module has API_KEY, MIN_VERSION, MAX_VERSION (the versions it serves: for every API, those
of one Kafka release, `api_versions.KAFKA_RELEASE`), optionally ADVERTISED_MIN_VERSION (where
that release advertises more than it serves), and `handle(request: Request) -> Reply`. A reply
is a kio response entity, an awaitable of one (the handler has to wait, e.g. for fsync or a long
poll), or None when Kafka sends no response (Produce with acks=0). A module that
defines API_KEY is registered by being here.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import time
from collections.abc import Awaitable
from types import ModuleType
from typing import Any

from onceflow import failpoints
from onceflow.apis.authorization import authorized
from onceflow.apis.common import Request, VersionRange
from onceflow.apis.listener_endpoints import for_listener, names_brokers
from onceflow.apis.replies import map_reply

Reply = Any | Awaitable[Any] | None


def _api_modules() -> list[ModuleType]:
    """Every module of this package that defines an API (it has API_KEY)."""
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
    return [module for module in modules if hasattr(module, "API_KEY")]


HANDLERS: dict[int, ModuleType] = {module.API_KEY: module for module in _api_modules()}
SUPPORTED_VERSIONS: dict[int, VersionRange] = {
    key: VersionRange(module.MIN_VERSION, module.MAX_VERSION) for key, module in HANDLERS.items()
}
# What ApiVersions lists.
ADVERTISED_VERSIONS: dict[int, VersionRange] = {
    key: VersionRange(getattr(module, "ADVERTISED_MIN_VERSION", module.MIN_VERSION), module.MAX_VERSION)
    for key, module in HANDLERS.items()
}


def is_supported(api_key: int, api_version: int) -> bool:
    versions = SUPPORTED_VERSIONS.get(api_key)
    return versions is not None and versions.min <= api_version <= versions.max


# API keys whose handler raises: a planted bug (failpoint api.raise.K) for the fuzzer's tests.
_RAISING = frozenset(int(key) for key in failpoints.armed_with_prefix("api.raise."))
# API keys whose handler holds the event loop for 2 s, four times with a short gap between: a
# planted stall for the fuzzer's monitor, which probes every half second and counts a held loop
# only when two probes in a row waited (one slow probe is also what a loaded machine gives).
_BLOCKING = frozenset(int(key) for key in failpoints.armed_with_prefix("api.block."))
PLANTED_STALL_S = 2.0
PLANTED_STALLS = 4
PLANTED_GAP_S = 0.3


class _PlantedStall:
    """One series of holds at a time: a request that arrived in a gap starting another would
    close the gaps, and the monitor would see one long wait instead of two."""

    def __init__(self) -> None:
        self.running = False

    def start(self) -> None:
        if not self.running:
            self.running = True
            self._hold(PLANTED_STALLS)

    def _hold(self, times: int) -> None:
        time.sleep(PLANTED_STALL_S)
        if times > 1:  # the loop runs between two holds: a probe may be answered there
            asyncio.get_running_loop().call_later(PLANTED_GAP_S, self._hold, times - 1)
        else:
            self.running = False


_planted_stall = _PlantedStall()


def dispatch(request: Request) -> Reply:
    if request.api_key in _RAISING:
        raise RuntimeError(f"failpoint api.raise.{request.api_key}")
    if request.api_key in _BLOCKING:
        _planted_stall.start()
    broker = request.broker
    handle = HANDLERS[request.api_key].handle
    reply = handle(request) if broker.authorizer is None else authorized(request, handle)
    if request.session.listener != broker.inter_broker_listener and names_brokers(request.api_key):
        return map_reply(reply, lambda answer: for_listener(request, answer))
    return reply


__all__ = [
    "ADVERTISED_VERSIONS",
    "HANDLERS",
    "SUPPORTED_VERSIONS",
    "Reply",
    "Request",
    "dispatch",
    "is_supported",
]
