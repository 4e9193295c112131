"""ApiVersions (18): which APIs and versions this broker speaks."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.protocol.build import build
from onceflow.protocol.codec import response_type

API_KEY = 18
MIN_VERSION = 0
MAX_VERSION = 3


def _api_keys() -> list[dict[str, int]]:
    from onceflow.apis import SUPPORTED_VERSIONS  # the table is built from every module

    return [
        {"api_key": key, "min_version": versions.min, "max_version": versions.max}
        for key, versions in sorted(SUPPORTED_VERSIONS.items())
    ]


def handle(request: Request) -> Any:
    return request.respond(error_code=ErrorCode.none, api_keys=_api_keys(), throttle_time=0)


def unsupported_version_response() -> Any:
    """KIP-511: a v0 response carrying UNSUPPORTED_VERSION and the list, so the client can pick."""
    return build(response_type(API_KEY, 0), error_code=ErrorCode.unsupported_version, api_keys=_api_keys())
