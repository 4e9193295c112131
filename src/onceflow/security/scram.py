"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677, Kafka's KIP-84), the server's side.

A user's credential per mechanism is what Kafka stores: a salt, the iteration count, and the
stored and server keys derived from the salted password; the password itself is never kept.
The exchange is client-first, server-first, client-final (with the client's proof), server-final
(with the server's signature). An unknown user gets a server-first like any other, with a salt
derived from its name, and fails at the proof as a wrong password does: nothing tells them apart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from onceflow.security.sasl_errors import AuthenticationFailed

# Kafka's ScramMechanism: the hash and the iteration counts it accepts.
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# AlterUserScramCredentials' mechanism codes.
MECHANISM_CODES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def from_salted_password(
        cls, mechanism: str, salt: bytes, salted_password: bytes, iterations: int
    ) -> ScramCredential:
        """What AlterUserScramCredentials carries (KIP-554: the client salts the password)."""
        digest = HASHES[mechanism]
        client_key = hmac.digest(salted_password, b"Client Key", digest)
        return cls(
            salt,
            hashlib.new(digest, client_key).digest(),
            hmac.digest(salted_password, b"Server Key", digest),
            iterations,
        )

    @classmethod
    def from_password(
        cls, mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
    ) -> ScramCredential:
        salt = secrets.token_bytes(32) if salt is None else salt
        return cls.from_salted_password(
            mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations
        )

    def encode(self) -> str:
        """Kafka's form, as /config/users/<name> keeps it."""
        return (
            f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
            f"server_key={_b64(self.server_key)},iterations={self.iterations}"
        )

    @classmethod
    def decode(cls, text: str) -> ScramCredential:
        fields = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
        try:
            return cls(
                base64.b64decode(fields["salt"], validate=True),
                base64.b64decode(fields["stored_key"], validate=True),
                base64.b64decode(fields["server_key"], validate=True),
                int(fields["iterations"]),
            )
        except (KeyError, ValueError) as error:
            raise ValueError(f"not a SCRAM credential: {error}") from error


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class ScramServer:
    """One authentication: `step` takes client-first, then client-final."""

    def __init__(
        self,
        mechanism: str,
        credential_of: Callable[[str], ScramCredential | None],
        unknown_user_secret: bytes,
    ) -> None:
        self._mechanism = mechanism
        self._digest = HASHES[mechanism]
        self._credential_of = credential_of
        self._secret = unknown_user_secret
        self._user: str | None = None
        self._credential: ScramCredential | None = None
        self._known = False
        self._nonce = ""
        self._first_bare = ""
        self._server_first = ""
        self._gs2_header = ""

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        """The answer to the client's message, and the principal once authenticated."""
        try:
            message = token.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("not UTF-8") from None
        if self._user is None:
            return self._first(message).encode(), None
        return self._final(message).encode(), f"User:{self._user}"

    def _first(self, message: str) -> str:
        flag, _, rest = message.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag not in ("n", "y") or (authzid and not authzid.startswith("a=")):
            raise AuthenticationFailed("channel binding is not supported")
        attributes = _attributes(bare)
        user, client_nonce = attributes.get("n"), attributes.get("r")
        if not user or not client_nonce or any(key not in ("n", "r") for key in attributes):
            raise AuthenticationFailed("bad client-first message")  # includes tokenauth: no tokens here
        user = user.replace("=2C", ",").replace("=3D", "=")
        if authzid and authzid[2:] != user:
            raise AuthenticationFailed("authorization id differs from the user")
        credential = self._credential_of(user)
        self._known = credential is not None
        if credential is None:
            # A stand-in with a salt fixed per name, so that asking twice tells nothing either.
            salt = hmac.digest(self._secret, user.encode(), "sha256")[:20]
            credential = ScramCredential(salt, b"", b"", DEFAULT_ITERATIONS)
        self._user, self._credential = user, credential
        self._gs2_header = f"{flag},{authzid},"
        self._nonce = client_nonce + secrets.token_urlsafe(24)
        self._first_bare = bare
        self._server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        return self._server_first

    def _final(self, message: str) -> str:
        assert self._credential is not None
        without_proof, _, proof_part = message.rpartition(",p=")
        attributes = _attributes(without_proof)
        try:
            proof = base64.b64decode(proof_part, validate=True)
            binding = base64.b64decode(attributes.get("c", ""), validate=True)
        except ValueError:
            raise AuthenticationFailed("bad client-final message") from None
        # Kafka checks that the nonce ends with the server's: older librdkafka sends its own again
        # in front of it.
        if binding != self._gs2_header.encode() or not attributes.get("r", "").endswith(self._nonce):
            raise AuthenticationFailed("bad client-final message")
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(self._credential.stored_key, auth_message, self._digest)
        if len(proof) != len(signature):
            raise AuthenticationFailed("invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        stored_key = hashlib.new(self._digest, client_key).digest()
        if not hmac.compare_digest(stored_key, self._credential.stored_key) or not self._known:
            raise AuthenticationFailed("invalid credentials")
        server_signature = hmac.digest(self._credential.server_key, auth_message, self._digest)
        return f"v={_b64(server_signature)}"


def _attributes(message: str) -> dict[str, str]:
    """`a=1,b=2` as a dict; an attribute without `=` makes the message bad."""
    attributes = {}
    for item in message.split(","):
        key, sep, value = item.partition("=")
        if not sep or len(key) != 1:
            raise AuthenticationFailed("bad SCRAM message")
        attributes[key] = value
    return attributes


class ScramClient:
    """The client's side, for a broker that logs in to another (inter-broker SASL/SCRAM)."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self._mechanism = mechanism
        self._digest = HASHES[mechanism]
        self._password = password
        name = user.replace("=", "=3D").replace(",", "=2C")
        self._first_bare = f"n={name},r={secrets.token_urlsafe(24)}"
        self._auth_message = b""
        self._salted = b""

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        message = server_first.decode()
        attributes = _attributes(message)
        nonce, iterations = attributes.get("r", ""), int(attributes.get("i", "0"))
        if not nonce.startswith(_attributes(self._first_bare)["r"]) or iterations < MIN_ITERATIONS:
            raise AuthenticationFailed("bad server-first message")
        salt = base64.b64decode(attributes.get("s", ""))
        self._salted = salted_password(self._mechanism, self._password, salt, iterations)
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        self._auth_message = f"{self._first_bare},{message},{without_proof}".encode()
        client_key = hmac.digest(self._salted, b"Client Key", self._digest)
        stored_key = hashlib.new(self._digest, client_key).digest()
        signature = hmac.digest(stored_key, self._auth_message, self._digest)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        server_key = hmac.digest(self._salted, b"Server Key", self._digest)
        expected = f"v={_b64(hmac.digest(server_key, self._auth_message, self._digest))}"
        if not hmac.compare_digest(server_final.decode(errors="replace"), expected):
            raise AuthenticationFailed("the server's signature does not match")
