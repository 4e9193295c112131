"""A connection's identity and, on a SASL listener, its SASL exchange (KIP-152, KIP-368).

On a SASL listener a client may send ApiVersions, SaslHandshake (naming the mechanism) and
SaslAuthenticate (the mechanism's messages) until it is authenticated; any other request closes
the connection. With `connections.max.reauth.ms` the session lasts that long: the client
authenticates again on the same connection (same mechanism, same principal), and a request
other than those three after the session expired closes the connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from kio.schema.errors import ErrorCode

from onceflow.security.principal import ANONYMOUS
from onceflow.security.sasl_errors import AuthenticationFailed

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
BEFORE_AUTHENTICATION = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})


class Mechanism(Protocol):
    def step(self, token: bytes) -> tuple[bytes, str | None]:
        """The answer to the client's message, and the principal once authenticated; raises
        AuthenticationFailed."""
        ...


class IllegalSaslState(Exception):
    """A SASL request out of turn (ILLEGAL_SASL_STATE); the connection closes."""


class Session:
    def __init__(
        self,
        host: str,
        listener: str = "PLAINTEXT",
        principal: str = ANONYMOUS,
        mechanisms: Mapping[str, Callable[[], Mechanism]] | None = None,
        reauth_ms: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`mechanisms` (by name) make this a SASL listener's connection."""
        self.host = host
        self.listener = listener
        self.principal = principal
        self.mechanisms = mechanisms
        self.authenticated = mechanisms is None
        self.expires_at: float | None = None  # monotonic, with connections.max.reauth.ms
        self.failed = False  # answered SASL_AUTHENTICATION_FAILED: close after the answer
        self.raw_tokens = False  # SaslHandshake v0: tokens come unframed (before KIP-152)
        self._reauth_ms = reauth_ms
        self._clock = clock
        self._mechanism_name: str | None = None
        self._mechanism: Mechanism | None = None
        self.authentications = 0

    @property
    def sasl(self) -> bool:
        return self.mechanisms is not None

    def allows(self, api_key: int) -> bool:
        """Whether a request of this API may be served now."""
        if self.authenticated and self.expires_at is None:
            return True
        if api_key in BEFORE_AUTHENTICATION:
            return True
        return self.authenticated and self.expires_at is not None and self._clock() < self.expires_at

    def handshake(self, mechanism: str, version: int) -> ErrorCode:
        """SaslHandshake: pick the mechanism of the next authentication."""
        if self.mechanisms is None or self._mechanism is not None:
            return ErrorCode.illegal_sasl_state
        factory = self.mechanisms.get(mechanism)
        if factory is None:
            return ErrorCode.unsupported_sasl_mechanism
        if self.authenticated and mechanism != self._mechanism_name:
            return ErrorCode.illegal_sasl_state  # KIP-368: re-authenticate as before
        if self.authenticated and version == 0:
            return ErrorCode.illegal_sasl_state  # re-authentication needs SaslAuthenticate
        self._mechanism_name, self._mechanism = mechanism, factory()
        self.raw_tokens = version == 0
        return ErrorCode.none

    def authenticate(self, token: bytes) -> tuple[bytes, int, bool]:
        """One SaslAuthenticate (or raw token): the mechanism's answer, the session's lifetime in
        ms (0: no limit), and whether the client is now authenticated. Raises IllegalSaslState,
        or AuthenticationFailed (after which `failed` is set)."""
        if self._mechanism is None:
            raise IllegalSaslState("SaslAuthenticate before SaslHandshake")
        try:
            answer, principal = self._mechanism.step(token)
            if principal is not None and self.authenticated and principal != self.principal:
                raise AuthenticationFailed("re-authentication as another principal")
        except AuthenticationFailed:
            self.failed = True
            self._mechanism = None
            raise
        if principal is None:
            return answer, 0, False
        self._mechanism = None
        self.principal = principal
        self.authenticated = True
        self.raw_tokens = False
        self.authentications += 1
        if self._reauth_ms > 0:
            self.expires_at = self._clock() + self._reauth_ms / 1000
        return answer, self._reauth_ms, True
