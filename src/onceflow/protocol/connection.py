"""One client connection as a state machine: bytes in, events out.

The shell feeds whatever the socket produced into `receive_data` and acts on
the events; it turns responses into bytes with `encode_response`. Framing
errors that leave the stream unusable raise `ProtocolError`, and the shell
closes the connection, as Kafka does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from onceflow.protocol.codec import (
    MalformedRequestError,
    UnknownApiError,
    decode_request,
    peek_request_prefix,
)

_INT32 = struct.Struct(">i")
API_VERSIONS_KEY = 18


class ProtocolError(Exception):
    """The byte stream cannot be trusted any more; close the connection."""


@dataclass(frozen=True, slots=True)
class RequestReceived:
    api_key: int
    api_version: int
    correlation_id: int
    header: Any
    body: Any
    size: int


@dataclass(frozen=True, slots=True)
class UnsupportedApiVersionsRequest:
    """ApiVersions with a version we do not know: clients expect a v0 answer (KIP-511)."""

    correlation_id: int


class Connection:
    def __init__(self, max_request_bytes: int) -> None:
        self._max_request_bytes = max_request_bytes
        # Only the start of a frame that a later read completes waits here; whole frames are
        # decoded straight from the bytes the shell passed in.
        self._pending = bytearray()

    def receive_data(
        self, data: bytes | bytearray | memoryview
    ) -> list[RequestReceived | UnsupportedApiVersionsRequest]:
        if self._pending:
            self._pending += data
            stream: bytes | bytearray | memoryview = self._pending
        else:
            stream = data
        events: list[RequestReceived | UnsupportedApiVersionsRequest] = []
        # kio's native reader takes read-only buffers only; toreadonly() copies nothing.
        with memoryview(stream).toreadonly() as view:
            position = self._decode_frames(view, events)
            if stream is self._pending:
                # Frames are decoded into objects of their own (kio copies bytes fields out),
                # so no view into the buffer outlives this call and it may shrink.
                view.release()
                del self._pending[:position]
            else:
                self._pending += view[position:]
        return events

    def _decode_frames(
        self, view: memoryview, events: list[RequestReceived | UnsupportedApiVersionsRequest]
    ) -> int:
        """Decode every whole frame in `view`; returns where the unfinished rest starts."""
        position = 0
        while len(view) - position >= 4:
            (size,) = _INT32.unpack_from(view, position)
            if size < 8 or size > self._max_request_bytes:
                raise ProtocolError(f"request size {size} outside 8..{self._max_request_bytes}")
            end = position + 4 + size
            if len(view) < end:
                break
            with view[position + 4 : end] as frame:
                events.append(self._decode(frame))
            position = end
        return position

    @staticmethod
    def _decode(frame: memoryview) -> RequestReceived | UnsupportedApiVersionsRequest:
        try:
            api_key, api_version, correlation_id = peek_request_prefix(frame)
            header, body = decode_request(frame)
        except UnknownApiError as error:
            if api_key == API_VERSIONS_KEY:
                return UnsupportedApiVersionsRequest(correlation_id)
            raise ProtocolError(str(error)) from error
        except MalformedRequestError as error:
            raise ProtocolError(str(error)) from error
        return RequestReceived(api_key, api_version, correlation_id, header, body, len(frame))
