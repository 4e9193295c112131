"""SaslAuthenticate (36): one message of the mechanism chosen by SaslHandshake, and the
broker's answer. A failure answers SASL_AUTHENTICATION_FAILED with one message whatever went
wrong (an unknown user, a wrong password, a malformed message), is counted, and closes the
connection; v1+ answers the session's lifetime under `connections.max.reauth.ms` (KIP-368)."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.security.sasl_errors import AuthenticationFailed
from onceflow.security.session import IllegalSaslState

API_KEY = 36
MIN_VERSION = 0
MAX_VERSION = 2
# Kafka's message, whatever was wrong.
FAILED = "Authentication failed: Invalid username or password"

log = logging.getLogger(__name__)


def handle(request: Request) -> Any:
    session = request.session
    metrics = request.broker.metrics
    try:
        answer, lifetime_ms, done = session.authenticate(bytes(request.body.auth_bytes))
    except IllegalSaslState as error:
        session.failed = True
        return _failed(request, ErrorCode.illegal_sasl_state, str(error))
    except AuthenticationFailed as error:
        log.info("SASL authentication from %s failed: %s", session.host, error)
        metrics.authentication(session.listener, succeeded=False)
        return _failed(request, ErrorCode.sasl_authentication_failed, FAILED)
    if done:
        metrics.authentication(session.listener, succeeded=True)
    return request.respond(
        error_code=ErrorCode.none, error_message=None, auth_bytes=answer, session_lifetime=lifetime_ms
    )


def _failed(request: Request, code: ErrorCode, message: str) -> Any:
    return request.respond(error_code=code, error_message=message, auth_bytes=b"", session_lifetime=0)
