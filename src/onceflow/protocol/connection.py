"""One client connection as a state machine: bytes in, events out.

The shell reads into `get_buffer()` and reports each read to `buffer_updated`
(or passes bytes it read elsewhere to `receive_data`), acts on the events, and
turns responses into bytes with `encode_response`. Framing errors that leave
the stream unusable raise `ProtocolError`, and the shell closes the
connection, as Kafka does.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

from onceflow.protocol.codec import (
    MalformedRequestError,
    UnknownApiError,
    decode_request,
    peek_request_prefix,
)
from onceflow.protocol.limits import MemoryPool

_INT32 = struct.Struct(">i")
API_VERSIONS_KEY = 18
# Reads go into a buffer of this size, where frames that fit are decoded; a larger frame gets a
# buffer of its own, kept for the next one.
READ_BUFFER_BYTES = 64 * 1024


def _frame_buffer(size: int) -> mmap.mmap:
    """Memory for a frame of `size` bytes that takes memory only as its bytes arrive (an
    anonymous mapping's pages are made on first write): a client that announces a frame of
    socket.request.max.bytes and sends nothing more costs next to nothing."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


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
class SaslTokenReceived:
    """A SASL token sent unframed, after SaslHandshake v0 (before KIP-152's SaslAuthenticate)."""

    token: bytes


@dataclass(frozen=True, slots=True)
class UnsupportedApiVersionsRequest:
    """ApiVersions with a version we do not know: clients expect a v0 answer (KIP-511)."""

    correlation_id: int


Event = RequestReceived | UnsupportedApiVersionsRequest | SaslTokenReceived


class Connection:
    """Framing and decoding. The shell either passes what it read (`receive_data`) or reads
    straight into `get_buffer()` and reports how much arrived (`buffer_updated`), which copies
    nothing on the way to the decoder: frames up to `read_buffer_bytes` are decoded where they
    were read, a larger one (a Produce request of 1 MB batches) is read into a buffer of its
    size, reused from frame to frame."""

    def __init__(
        self,
        max_request_bytes: int,
        read_buffer_bytes: int = READ_BUFFER_BYTES,
        pool: MemoryPool | None = None,
    ) -> None:
        # Lowered by the shell until a SASL client is authenticated (sasl.server.max.receive.size).
        self.max_request_bytes = max_request_bytes
        # Set by the shell while frames are SASL tokens (SaslHandshake v0), not requests.
        self.raw_frames = False
        # A frame that needs a buffer of its own takes its size from `pool` first; while it
        # cannot (`waiting_for_memory`), the shell reads nothing more from this connection.
        self._pool = pool
        self._reserved = 0
        self.waiting_for_memory = 0
        self._reads = bytearray(read_buffer_bytes)
        self._start = 0  # where the first frame not yet decoded starts in `_reads`
        self._end = 0  # where the bytes read end in `_reads`
        self._frame_buffer: mmap.mmap | None = None
        self._frame: memoryview | None = None  # a frame too large for `_reads`, being read
        self._filled = 0  # bytes of `_frame` read so far

    def get_buffer(self) -> memoryview:
        """Where the next bytes read go; never empty."""
        if self._frame is not None:
            return self._frame[self._filled :]
        return memoryview(self._reads)[self._end :]

    def buffer_updated(self, nbytes: int) -> list[Event]:
        """`nbytes` were read into the last `get_buffer()`: the requests they completed."""
        events: list[Event] = []
        if self._frame is not None:
            self._filled += nbytes
            if self._filled == len(self._frame):
                frame, self._frame = self._frame, None
                try:
                    with frame.toreadonly() as view:
                        events.append(self._decode(view))
                finally:
                    self._release()
                assert self._frame_buffer is not None
                # Its pages are free for the kernel to take back when it needs memory (a
                # connection gone idle holds none); until then the next frame reuses them as
                # they are. MADV_DONTNEED, which frees them at once, cost the broker 1.2 x CPU.
                self._frame_buffer.madvise(mmap.MADV_FREE)
            return events
        self._end += nbytes
        # kio's native reader takes read-only buffers only; toreadonly() copies nothing. Frames
        # are decoded into objects of their own (kio copies bytes fields out), so no view into
        # `_reads` outlives this call and its bytes may be read over.
        with memoryview(self._reads).toreadonly() as reads, reads[self._start : self._end] as unread:
            self._start += self._decode_frames(unread, events)
        self._make_room()
        return events

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """The requests that `data`, the next bytes of the stream, completed."""
        events: list[Event] = []
        with memoryview(data) as source:
            position = 0
            while position < len(source):
                target = self.get_buffer()
                count = min(len(target), len(source) - position)
                target[:count] = source[position : position + count]
                events += self.buffer_updated(count)
                position += count
        return events

    def _make_room(self) -> None:
        """Leave room in `_reads` for the rest of the unfinished frame, or move that frame to a
        buffer of its own when it cannot fit."""
        unread = self._end - self._start
        if unread == 0:
            self._start = self._end = 0
            return
        if unread >= _INT32.size:
            (size,) = _INT32.unpack_from(self._reads, self._start)  # checked by _decode_frames
            if _INT32.size + size > len(self._reads):
                if not self._reserve(size):
                    return  # the shell stops reading until memory is released (`retry_reservation`)
                if self._frame_buffer is None or len(self._frame_buffer) < size:
                    self._frame_buffer = _frame_buffer(size)  # replaced: a view may be alive
                self._frame = memoryview(self._frame_buffer)[:size]
                self._filled = unread - _INT32.size
                with memoryview(self._reads) as reads:
                    self._frame[: self._filled] = reads[self._start + _INT32.size : self._end]
                self._start = self._end = 0
                return
            if self._start + _INT32.size + size <= len(self._reads):
                return
        elif self._start + _INT32.size <= len(self._reads):
            return
        self._reads[:unread] = self._reads[self._start : self._end]  # a copy first: they may overlap
        self._start, self._end = 0, unread

    def _reserve(self, size: int) -> bool:
        if self._pool is None:
            return True
        if not self._pool.try_reserve(size):
            self.waiting_for_memory = size
            return False
        self._reserved, self.waiting_for_memory = size, 0
        return True

    def _release(self) -> None:
        if self._pool is not None and self._reserved:
            self._pool.release(self._reserved)
        self._reserved = 0

    def retry_reservation(self) -> bool:
        """After memory was released: whether the waiting frame now has its buffer."""
        self._make_room()
        return not self.waiting_for_memory

    def close(self) -> None:
        """The connection is gone: give back the memory its unfinished frame holds."""
        self._release()
        self.waiting_for_memory = 0

    def _decode_frames(self, view: memoryview, events: list[Event]) -> int:
        """Decode every whole frame in `view`; returns where the unfinished rest starts."""
        position = 0
        while len(view) - position >= 4:
            (size,) = _INT32.unpack_from(view, position)
            if size < 8 or size > self.max_request_bytes:
                raise ProtocolError(f"request size {size} outside 8..{self.max_request_bytes}")
            end = position + 4 + size
            if len(view) < end:
                break
            with view[position + 4 : end] as frame:
                events.append(self._decode(frame))
            position = end
        return position

    def _decode(self, frame: memoryview) -> Event:
        if self.raw_frames:
            return SaslTokenReceived(bytes(frame))
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
