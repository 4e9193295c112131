"""SaslHandshake (17): the SASL mechanism of the next authentication (KIP-152 from v1; v0's
tokens follow unframed). UNSUPPORTED_SASL_MECHANISM lists the listener's mechanisms; on a
listener without SASL, or out of turn, ILLEGAL_SASL_STATE."""

from __future__ import annotations

from typing import Any

from onceflow.apis.common import Request

API_KEY = 17
MIN_VERSION = 0
MAX_VERSION = 1


def handle(request: Request) -> Any:
    session = request.session
    code = session.handshake(request.body.mechanism, request.api_version)
    return request.respond(error_code=code, mechanisms=sorted(session.mechanisms or ()))
