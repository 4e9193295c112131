"""Requests one broker sends another: a follower's fetches, a transaction coordinator's markers."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.broker.security import ClientSecurity
from onceflow.protocol.build import build
from onceflow.protocol.codec import decode_response, encode_request, request_type
from onceflow.protocol.fetch_answers import API_KEY as FETCH
from onceflow.protocol.fetch_answers import VERSION as FETCH_VERSION
from onceflow.protocol.fetch_answers import FetchAnswer, read_fetch_answer
from onceflow.security.scram import ScramClient
from onceflow.security.session import SASL_AUTHENTICATE, SASL_HANDSHAKE

_INT32 = struct.Struct(">i")
_INT32_MAX = 2**31 - 1
# An answer larger than this is not one a broker sends (a follower asks for at most 10 MiB).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


def client_id(broker_id: int) -> str:
    return f"onceflow-broker-{broker_id}"


class Link(asyncio.BufferedProtocol):
    """A connection to another broker, one request at a time. Each answer is read straight
    into one buffer, reused from answer to answer: a follower's answers run to megabytes, and a
    stream reader would copy them twice more (into its buffer, and out of it). Reuse is safe as
    an answer is decoded, and a fetch's records appended, before the next request goes."""

    def __init__(self, sender_id: int) -> None:
        self.sender_id = sender_id
        self._transport: asyncio.Transport | None = None
        self._correlation_id = 0
        self._size = bytearray(_INT32.size)
        self._buffer = bytearray()  # grows to the largest answer so far
        self._frame: memoryview | None = None  # the answer being read, once its size is known
        self._filled = 0
        self._answer: asyncio.Future[memoryview] | None = None
        self._lost: Exception | None = None

    @classmethod
    async def open(
        cls, address: tuple[str, int], sender_id: int, security: ClientSecurity | None = None
    ) -> Link:
        """A connection to the broker at `address`, over TLS and logged in with SASL as the
        inter-broker listener asks. A failed login raises ConnectionError."""
        loop = asyncio.get_running_loop()
        context = None if security is None else security.ssl_context
        _, link = await loop.create_connection(
            lambda: cls(sender_id), *address, ssl=context, server_hostname=address[0] if context else None
        )
        if security is not None and security.mechanism is not None:
            try:
                await link._log_in(security)
            except BaseException:
                link.close()
                raise
        return link

    async def _log_in(self, security: ClientSecurity) -> None:
        """SaslHandshake v1, then SaslAuthenticate with the mechanism's messages (KIP-152)."""
        mechanism = security.mechanism
        assert mechanism is not None
        answer = await self.exchange(SASL_HANDSHAKE, 1, {"mechanism": mechanism})
        if answer.error_code != ErrorCode.none:
            raise ConnectionError(f"SASL handshake refused: {answer.error_code.name}")
        if mechanism == "PLAIN":
            tokens = [f"\0{security.username}\0{security.password}".encode()]
            await self._authenticate(tokens[0])
            return
        client = ScramClient(mechanism, security.username, security.password)
        server_first = await self._authenticate(client.first())
        client.verify(await self._authenticate(client.final(server_first)))

    async def _authenticate(self, token: bytes) -> bytes:
        answer = await self.exchange(SASL_AUTHENTICATE, 2, {"auth_bytes": token})
        if answer.error_code != ErrorCode.none:
            raise ConnectionError(f"SASL authentication failed: {answer.error_message}")
        return bytes(answer.auth_bytes)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def exchange(self, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        """Send one request and return the body of its answer. Raises OSError when the
        connection fails, ValueError when the answer is not this request's or not readable."""
        frame = await self._answer_to(api_key, version, fields)
        with frame.toreadonly() as view:
            answered_id, response = decode_response(api_key, version, view)
        self._check_answered(answered_id)
        return response

    async def fetch(self, fields: dict[str, Any]) -> FetchAnswer:
        """`exchange` for a follower's Fetch (v12), whose answer's records are views into this
        link's buffer (`fetch_answers`): valid until the next request, which must wait until
        they are appended."""
        frame = await self._answer_to(FETCH, FETCH_VERSION, fields)
        answered_id, answer = read_fetch_answer(frame.toreadonly())
        self._check_answered(answered_id)
        return answer

    async def _answer_to(self, api_key: int, version: int, fields: dict[str, Any]) -> memoryview:
        """Send one request; its answer's frame, in the link's buffer until the next request."""
        if self._lost is not None:
            raise ConnectionError(f"the connection is gone: {self._lost}")
        assert self._transport is not None and self._answer is None, "one request at a time"
        self._correlation_id = self._correlation_id + 1 if self._correlation_id < _INT32_MAX else 1
        body = build(request_type(api_key, version), fields)
        header = build(
            body.__header_schema__,
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=self._correlation_id,
            client_id=client_id(self.sender_id),
        )
        self._answer = asyncio.get_running_loop().create_future()
        try:
            # Requests are small (fetches, markers): the transport buffers what the socket
            # does not take at once, and the answer comes only after all of it anyway.
            self._transport.write(encode_request(header, body))
            return await self._answer
        finally:
            self._answer = None

    def _check_answered(self, answered_id: int) -> None:
        if answered_id != self._correlation_id:
            raise ValueError(f"answer {answered_id} to request {self._correlation_id}")

    # -- asyncio.BufferedProtocol ------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._size if self._frame is None else self._frame)[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._frame is None:
            if self._filled < len(self._size):
                return
            (size,) = _INT32.unpack(self._size)
            if not _INT32.size <= size <= MAX_ANSWER_BYTES:
                self._fail(ValueError(f"an answer of {size} bytes"))
                return
            if len(self._buffer) < size:
                self._buffer = bytearray(size)  # replaced, not resized: an old view may be alive
            self._frame, self._filled = memoryview(self._buffer)[:size], 0
        elif self._filled == len(self._frame):
            frame, self._frame, self._filled = self._frame, None, 0
            if self._answer is None or self._answer.done():
                self._fail(ValueError("an answer to no request"))
            else:
                self._answer.set_result(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc if exc is not None else ConnectionResetError("closed by the other broker")
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(ConnectionError(f"the connection is gone: {self._lost}"))

    def _fail(self, error: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)
        self._lost = error
        assert self._transport is not None
        self._transport.abort()


async def request_once(
    address: tuple[str, int],
    sender_id: int,
    api_key: int,
    version: int,
    fields: dict[str, Any],
    security: ClientSecurity | None = None,
) -> Any:
    """One request on a connection of its own."""
    link = await Link.open(address, sender_id, security)
    try:
        return await link.exchange(api_key, version, fields)
    finally:
        link.close()
