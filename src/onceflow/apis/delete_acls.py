"""DeleteAcls (31): remove the ACLs each filter matches, answering them; stored (as CreateAcls)
before the answer. SECURITY_DISABLED without an authorizer."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.acl_requests import AclError, acl_filter, described
from onceflow.apis.common import Request
from onceflow.security.acls import AclFilter

API_KEY = 31
MIN_VERSION = 1
MAX_VERSION = 3


def handle(request: Request) -> Any:
    filters = request.body.filters
    if request.broker.authorizer is None:
        return _answer(
            request, [_error(ErrorCode.security_disabled, "No Authorizer is configured.")] * len(filters)
        )
    parsed: list[AclFilter | AclError] = []
    for fields in filters:
        try:
            parsed.append(acl_filter(fields))
        except AclError as error:
            parsed.append(error)
    return _deleted(request, parsed)


async def _deleted(request: Request, parsed: list[AclFilter | AclError]) -> Any:
    valid = [found for found in parsed if isinstance(found, AclFilter)]
    try:
        matched = iter(await request.broker.security.delete_acls(valid))
    except Exception as error:  # the store failed: nothing deleted
        return _answer(
            request,
            [_error(ErrorCode.unknown_server_error, f"storing the ACLs failed: {error}")] * len(parsed),
        )
    results = []
    for found in parsed:
        if isinstance(found, AclError):
            results.append(_error(ErrorCode.invalid_request, str(found)))
            continue
        results.append(
            {
                "error_code": ErrorCode.none,
                "error_message": None,
                "matching_acls": [
                    {"error_code": ErrorCode.none, "error_message": None, **described(gone)}
                    for gone in next(matched)
                ],
            }
        )
    return _answer(request, results)


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "matching_acls": []}


def _answer(request: Request, results: list[dict[str, Any]]) -> Any:
    return request.respond(throttle_time=0, filter_results=results)
