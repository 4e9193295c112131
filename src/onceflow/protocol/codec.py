"""Request decoding and response encoding with kio's generated types.

kio's native readers are fast, so they are built once per (api key, version)
and cached. Its writers are pure Python and slow; `protocol.writers` compiles
ones that write the same bytes.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.serial import entity_reader

from onceflow import failpoints
from onceflow.protocol.bounds import Frame, FrameBoundsError, check_frame
from onceflow.protocol.writers import entity_writer

_INT32 = struct.Struct(">i")
# Off only when a test plants the bug the check prevents, to show that the fuzzer finds it.
_CHECK_BOUNDS = not failpoints.armed("protocol.no-bounds-check")
_REQUEST_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id
# Records at least this big go to the socket as they are, not copied into the response's frame.
OWN_PIECE_BYTES = 64 * 1024


class UnknownApiError(ValueError):
    """The request names an API key or version this build of kio cannot decode."""


class MalformedRequestError(ValueError):
    """The request frame could not be decoded."""


def peek_request_prefix(frame: Frame) -> tuple[int, int, int]:
    """Api key, version and correlation id, readable even when the rest is not."""
    if len(frame) < _REQUEST_PREFIX.size:
        raise MalformedRequestError(f"request frame of {len(frame)} bytes is too short")
    api_key, api_version, correlation_id = _REQUEST_PREFIX.unpack_from(frame)
    return api_key, api_version, correlation_id


@cache
def request_type(api_key: int, api_version: int) -> type[Any]:
    try:
        return load_request_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity) as error:
        raise UnknownApiError(f"unknown api key {api_key} version {api_version}") from error


@cache
def response_type(api_key: int, api_version: int) -> type[Any]:
    return load_response_schema(api_key, api_version)


@cache
def _request_readers(api_key: int, api_version: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    body = request_type(api_key, api_version)
    return entity_reader(body.__header_schema__), entity_reader(body)


def decode_request(frame: Frame) -> tuple[Any, Any]:
    """(header, body) of one request frame without its length prefix."""
    api_key, api_version, _ = peek_request_prefix(frame)
    read_header, read_body = _request_readers(api_key, api_version)
    body_class = request_type(api_key, api_version)
    try:
        # The native reader trusts lengths; this check makes sure they fit the frame first.
        if _CHECK_BOUNDS:
            check_frame(frame, body_class.__header_schema__, body_class)
    except FrameBoundsError as error:
        raise MalformedRequestError(
            f"api {api_key} v{api_version} does not fit its frame: {error}"
        ) from error
    try:
        header, header_size = read_header(frame, 0)
        body, _ = read_body(frame, header_size)
    except Exception as error:  # kio raises assorted errors on garbage input
        raise MalformedRequestError(f"cannot decode api {api_key} v{api_version}: {error}") from error
    # Bytes after the body are ignored, as Kafka does: librdkafka 2.16 sends a few after some
    # Metadata v12 requests.
    return header, body


@cache
def _response_readers(api_key: int, api_version: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    body = response_type(api_key, api_version)
    return entity_reader(body.__header_schema__), entity_reader(body)


def decode_response(api_key: int, api_version: int, frame: bytes | memoryview) -> tuple[int, Any]:
    """The correlation id and body of a response frame (without its length prefix) to a request
    of that API and version; a response does not name its API, so the caller must remember the
    request's. Only for responses of a trusted broker: the lengths are not checked against the
    frame."""
    try:
        read_header, read_body = _response_readers(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity) as error:
        raise UnknownApiError(f"unknown api key {api_key} version {api_version}") from error
    try:
        header, header_size = read_header(frame, 0)
        body, _ = read_body(frame, header_size)
    except Exception as error:  # kio raises assorted errors on garbage input
        raise MalformedRequestError(f"cannot decode the response of api {api_key} v{api_version}") from error
    return header.correlation_id, body


def encode_response(correlation_id: int, response: Any) -> bytes:
    """A complete response frame, length prefix included."""
    return b"".join(encode_response_pieces(correlation_id, response))


def encode_response_pieces(correlation_id: int, response: Any) -> list[bytes | bytearray]:
    """A complete response frame in pieces for the socket: a fetch's records of 64 KiB or more
    are pieces of their own, so they are sent as they are instead of copied into the frame."""
    header_class = response.__header_schema__
    pieces = _Pieces()
    entity_writer(header_class)(pieces.write, header_class(correlation_id=correlation_id))
    entity_writer(type(response))(pieces.write, response)
    return pieces.finish()


def encode_request(header: Any, body: Any) -> bytes:
    """A complete request frame, length prefix included: what `decode_request` reads back."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    entity_writer(type(header))(buffer.write, header)
    entity_writer(type(body))(buffer.write, body)
    frame = buffer.getbuffer()
    _INT32.pack_into(frame, 0, len(frame) - 4)
    del frame
    return buffer.getvalue()


class _Pieces:
    """Small writes gathered into one piece; big ones (records) kept as they are."""

    def __init__(self) -> None:
        self._pieces: list[bytes | bytearray] = []
        self._small = bytearray(_INT32.size)  # the length prefix, filled in by `finish`

    def write(self, data: bytes) -> None:
        if len(data) < OWN_PIECE_BYTES:
            self._small += data
        else:
            self._pieces += (self._small, data)
            self._small = bytearray()

    def finish(self) -> list[bytes | bytearray]:
        pieces = [*self._pieces, self._small] if self._small else self._pieces
        _INT32.pack_into(pieces[0], 0, sum(map(len, pieces)) - _INT32.size)
        return pieces
