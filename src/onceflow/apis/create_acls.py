"""CreateAcls (30): add ACLs. Each creation is checked as Kafka checks it (INVALID_REQUEST with
its message); the valid ones are stored (the data directory's file fsynced, or ZooKeeper in a
cluster) before the answer, and apply from then on. SECURITY_DISABLED without an authorizer."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.acl_requests import AclError, binding
from onceflow.apis.common import Request
from onceflow.security.acls import AclBinding

API_KEY = 30
MIN_VERSION = 1
MAX_VERSION = 3


def handle(request: Request) -> Any:
    creations = request.body.creations
    if request.broker.authorizer is None:
        return _answer(
            request, [(ErrorCode.security_disabled, "No Authorizer is configured.")] * len(creations)
        )
    results: list[tuple[ErrorCode, str | None]] = []
    valid: list[AclBinding] = []
    for creation in creations:
        try:
            valid.append(binding(creation))
        except AclError as error:
            results.append((ErrorCode.invalid_request, str(error)))
        else:
            results.append((ErrorCode.none, None))
    return _stored(request, valid, results)


async def _stored(
    request: Request, valid: list[AclBinding], results: list[tuple[ErrorCode, str | None]]
) -> Any:
    if valid:
        try:
            await request.broker.security.create_acls(valid)
        except Exception as error:  # the store failed (a full disk, ZooKeeper gone): nothing applied
            results = [
                (ErrorCode.unknown_server_error, f"storing the ACLs failed: {error}")
                if code == ErrorCode.none
                else (code, message)
                for code, message in results
            ]
    return _answer(request, results)


def _answer(request: Request, results: list[tuple[ErrorCode, str | None]]) -> Any:
    return request.respond(
        throttle_time=0,
        results=[{"error_code": code, "error_message": message} for code, message in results],
    )
