"""DescribeAcls (29): the ACLs a filter matches, grouped by resource pattern. SECURITY_DISABLED
without an authorizer, as Kafka answers."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.acl_requests import AclError, acl_filter, described
from onceflow.apis.common import Request

API_KEY = 29
MIN_VERSION = 1
MAX_VERSION = 3


def handle(request: Request) -> Any:
    authorizer = request.broker.authorizer
    if authorizer is None:
        return _answer(request, ErrorCode.security_disabled, "No Authorizer is configured.")
    try:
        wanted = acl_filter(request.body)
    except AclError as error:
        return _answer(request, ErrorCode.invalid_request, str(error))
    resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for found in authorizer.bindings:
        if wanted.matches(found):
            fields = described(found)
            key = (fields.pop("resource_type"), fields.pop("resource_name"), fields.pop("pattern_type"))
            resources.setdefault(key, []).append(fields)
    return request.respond(
        throttle_time=0,
        error_code=ErrorCode.none,
        error_message=None,
        resources=[
            {"resource_type": kind, "resource_name": name, "pattern_type": pattern, "acls": acls}
            for (kind, name, pattern), acls in resources.items()
        ],
    )


def _answer(request: Request, code: ErrorCode, message: str) -> Any:
    return request.respond(throttle_time=0, error_code=code, error_message=message, resources=[])
