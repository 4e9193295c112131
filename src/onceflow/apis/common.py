"""What every API handler shares: the request context and small helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from onceflow.broker.core import Broker
from onceflow.protocol.build import build
from onceflow.protocol.codec import response_type


class VersionRange(NamedTuple):
    min: int
    max: int


@dataclass(frozen=True, slots=True)
class Request:
    broker: Broker
    api_key: int
    api_version: int
    header: Any
    body: Any

    def respond(self, **values: Any) -> Any:
        """The response entity of this request's API and version."""
        return build(response_type(self.api_key, self.api_version), values)


def topic_error(name: str, code: ErrorCode) -> dict[str, Any]:
    return {"name": name, "error_code": code}
