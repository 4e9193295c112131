"""ApiVersions (18): which APIs and versions this broker speaks: for each API it has, the versions
of one Kafka release, the latest whose every version of those APIs it serves (clients pinned to
that release's table, or an older one, send nothing it cannot read)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.protocol.build import build
from onceflow.protocol.codec import response_type

KAFKA_RELEASE = "4.1"
API_KEY = 18
MIN_VERSION = 0
MAX_VERSION = 4  # v4 is v3 (it lets supported features start at 0)


def _api_keys() -> list[dict[str, int]]:
    from onceflow.apis import ADVERTISED_VERSIONS  # the table is built from every module

    return [
        {"api_key": key, "min_version": versions.min, "max_version": versions.max}
        for key, versions in sorted(ADVERTISED_VERSIONS.items())
    ]


def handle(request: Request) -> Any:
    return request.respond(error_code=ErrorCode.none, api_keys=_api_keys(), throttle_time=0)


def unsupported_version_response() -> Any:
    """KIP-511: a v0 response carrying UNSUPPORTED_VERSION and the list, so the client can pick."""
    return build(response_type(API_KEY, 0), error_code=ErrorCode.unsupported_version, api_keys=_api_keys())
