"""DescribeUserScramCredentials (50): each user's SCRAM mechanisms and iteration counts (never
the salted keys); all users when none is named (a null or empty list). An unknown user is
RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE (KIP-554)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.security.scram import MECHANISM_CODES

API_KEY = 50
MIN_VERSION = 0
MAX_VERSION = 0
_CODES = {name: code for code, name in MECHANISM_CODES.items()}


def handle(request: Request) -> Any:
    credentials = request.broker.security.credentials
    users = request.body.users
    # None or empty: every user, as Kafka (librdkafka sends an empty list).
    names = [user.name for user in users] if users else sorted(credentials)
    counts = Counter(names)
    results = []
    for name in dict.fromkeys(names):
        result: dict[str, Any] = {"user": name, "error_code": ErrorCode.none, "error_message": None}
        if counts[name] > 1:
            result.update(
                error_code=ErrorCode.duplicate_resource,
                error_message=f"Cannot describe the same user twice in one request: {name}",
            )
        elif name not in credentials:
            result.update(
                error_code=ErrorCode.resource_not_found,
                error_message=f"Attempt to describe a user credential that does not exist: {name}",
            )
        result["credential_infos"] = (
            [
                {"mechanism": _CODES[mechanism], "iterations": credential.iterations}
                for mechanism, credential in sorted(credentials.get(name, {}).items())
            ]
            if result["error_code"] == ErrorCode.none
            else []
        )
        results.append(result)
    return request.respond(throttle_time=0, error_code=ErrorCode.none, error_message=None, results=results)
