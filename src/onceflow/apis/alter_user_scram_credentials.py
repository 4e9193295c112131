"""AlterUserScramCredentials (51): add, replace or delete users' SCRAM credentials (KIP-554: the
client sends the salt and the salted password, never the password). Kafka's checks: a known
mechanism (UNSUPPORTED_SASL_MECHANISM), 4096 to 16384 iterations and a user name
(UNACCEPTABLE_CREDENTIAL), a user's mechanism named once (DUPLICATE_RESOURCE), a deletion of a credential
that exists (RESOURCE_NOT_FOUND). The credentials are stored (the data directory's file fsynced,
or ZooKeeper's /config/users) before the answer, and the next authentication uses them."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.security.scram import MAX_ITERATIONS, MECHANISM_CODES, MIN_ITERATIONS, ScramCredential

API_KEY = 51
MIN_VERSION = 0
MAX_VERSION = 0


def handle(request: Request) -> Any:
    body = request.body
    security = request.broker.security
    entries = (*body.deletions, *body.upsertions)
    named = Counter((entry.name, int(entry.mechanism)) for entry in entries)
    errors: dict[str, tuple[ErrorCode, str]] = {}
    upserts: dict[tuple[str, str], ScramCredential] = {}
    deletions: list[tuple[str, str]] = []
    for entry in entries:
        mechanism = MECHANISM_CODES.get(int(entry.mechanism))
        problem = None
        if not entry.name:
            problem = (ErrorCode.unacceptable_credential, "Username must not be empty")
        elif named[entry.name, int(entry.mechanism)] > 1:
            problem = (
                ErrorCode.duplicate_resource,
                "A user credential cannot be altered twice in the same request",
            )
        elif mechanism is None:
            problem = (ErrorCode.unsupported_sasl_mechanism, f"Unknown SCRAM mechanism {entry.mechanism}")
        elif hasattr(entry, "salted_password"):
            if not MIN_ITERATIONS <= entry.iterations <= MAX_ITERATIONS:
                problem = (
                    ErrorCode.unacceptable_credential,
                    f"Iterations {entry.iterations} not in the range {MIN_ITERATIONS} to {MAX_ITERATIONS}",
                )
            elif not entry.salt or not entry.salted_password:
                problem = (ErrorCode.unacceptable_credential, "Salt and salted password must not be empty")
            else:
                upserts[entry.name, mechanism] = ScramCredential.from_salted_password(
                    mechanism, bytes(entry.salt), bytes(entry.salted_password), int(entry.iterations)
                )
        elif security.scram_credential(entry.name, mechanism) is None:
            problem = (
                ErrorCode.resource_not_found,
                f"Attempt to delete a user credential that does not exist: {entry.name}",
            )
        else:
            deletions.append((entry.name, mechanism))
        if problem is not None:
            errors.setdefault(entry.name, problem)
    upserts = {key: value for key, value in upserts.items() if key[0] not in errors}
    deletions = [key for key in deletions if key[0] not in errors]
    return _stored(request, list(dict.fromkeys(entry.name for entry in entries)), errors, upserts, deletions)


async def _stored(
    request: Request,
    users: list[str],
    errors: dict[str, tuple[ErrorCode, str]],
    upserts: dict[tuple[str, str], ScramCredential],
    deletions: list[tuple[str, str]],
) -> Any:
    if upserts or deletions:
        try:
            await request.broker.security.alter_credentials(upserts, deletions)
        except Exception as error:  # the store failed: nothing changed
            for user in users:
                errors.setdefault(
                    user, (ErrorCode.unknown_server_error, f"storing the credentials failed: {error}")
                )
    return request.respond(
        throttle_time=0,
        results=[
            {
                "user": user,
                "error_code": errors.get(user, (ErrorCode.none, None))[0],
                "error_message": errors.get(user, (ErrorCode.none, None))[1],
            }
            for user in users
        ],
    )
