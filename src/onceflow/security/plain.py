"""SASL/PLAIN (RFC 4616): one message, `authzid NUL user NUL password`, checked against the
users of the listener's JAAS config (`user_NAME="password"`, as Kafka's PlainLoginModule)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from onceflow.security.sasl_errors import AuthenticationFailed


class PlainServer:
    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("a PLAIN message has three parts")
        try:
            authzid, user, password = (part.decode() for part in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("not UTF-8") from None
        if not user or (authzid and authzid != user):
            raise AuthenticationFailed("bad user or authorization id")
        expected = self._users.get(user)
        # Compared in constant time, and against something for an unknown user too.
        matches = hmac.compare_digest((expected or "\0").encode(), password.encode())
        if expected is None or not matches:
            raise AuthenticationFailed("invalid credentials")
        return b"", f"User:{user}"
