"""What a SASL mechanism raises when authentication fails."""

from __future__ import annotations


class AuthenticationFailed(Exception):
    """The client did not prove who it is. The reason is logged, never sent: the client gets
    SASL_AUTHENTICATION_FAILED with one generic message, whatever was wrong."""
