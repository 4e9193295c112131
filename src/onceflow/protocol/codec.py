"""Request decoding and response encoding with kio's generated types.

kio's native readers are fast, so they are built once per (api key, version)
and cached. Writers are pure Python; they are cached the same way.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from onceflow import failpoints
from onceflow.protocol.bounds import Frame, FrameBoundsError, check_frame

_INT32 = struct.Struct(">i")
# Off only when a test plants the bug the check prevents, to show that the fuzzer finds it.
_CHECK_BOUNDS = not failpoints.armed("protocol.no-bounds-check")
_REQUEST_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


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


_ResponseWriters = tuple[type[Any], Callable[..., None], Callable[..., None]]
_response_writers_by_class: dict[type[Any], _ResponseWriters] = {}


def _response_writers(response_class: type[Any]) -> _ResponseWriters:
    writers = _response_writers_by_class.get(response_class)
    if writers is None:
        header_class = response_class.__header_schema__
        writers = (header_class, entity_writer(header_class), entity_writer(response_class))
        _response_writers_by_class[response_class] = writers
    return writers


def encode_response(correlation_id: int, response: Any) -> bytes:
    """A complete response frame, length prefix included."""
    header_class, write_header, write_body = _response_writers(type(response))
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write_header(buffer, header_class(correlation_id=correlation_id))
    write_body(buffer, response)
    frame = buffer.getbuffer()
    _INT32.pack_into(frame, 0, len(frame) - 4)
    del frame
    return buffer.getvalue()


def encode_request(header: Any, body: Any) -> bytes:
    """A complete request frame, length prefix included: what `decode_request` reads back."""
    write_header = _entity_writer(type(header))
    write_body = _entity_writer(type(body))
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    write_header(buffer, header)
    write_body(buffer, body)
    frame = buffer.getbuffer()
    _INT32.pack_into(frame, 0, len(frame) - 4)
    del frame
    return buffer.getvalue()


_writers_by_class: dict[type[Any], Callable[..., None]] = {}


def _entity_writer(entity_class: type[Any]) -> Callable[..., None]:
    writer = _writers_by_class.get(entity_class)
    if writer is None:
        writer = _writers_by_class[entity_class] = entity_writer(entity_class)
    return writer
