"""The asyncio shell: sockets in, protocol events to handlers, responses out.

Requests on one connection are dispatched in arrival order, so appends keep
the client's order. Replies that must wait (fsync, long poll) run as tasks
while later requests are dispatched; a writer sends the responses in request
order, which is what clients expect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

from onceflow.apis import Request, dispatch, is_supported
from onceflow.apis.api_versions import unsupported_version_response
from onceflow.broker.core import Broker
from onceflow.protocol.codec import encode_response
from onceflow.protocol.connection import (
    Connection,
    ProtocolError,
    RequestReceived,
    UnsupportedApiVersionsRequest,
)

log = logging.getLogger(__name__)

MAX_IN_FLIGHT_PER_CONNECTION = 64
READ_CHUNK_BYTES = 256 * 1024


class BrokerServer:
    def __init__(self, broker: Broker, host: str, port: int) -> None:
        self.broker = broker
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve_connection, self._host, self._port)
        host, port = self.address
        self.broker.start(host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        # Aborting the transports ends each connection's read loop, which then cleans up.
        for writer in self._connections.values():
            writer.transport.abort()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self.broker.stop()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        replies: asyncio.Queue[tuple[int, Any] | None] = asyncio.Queue(MAX_IN_FLIGHT_PER_CONNECTION)
        peer = writer.get_extra_info("peername")
        sender = asyncio.create_task(_send_replies(replies, writer, peer))
        connection = Connection(self.broker.config.get_int("socket.request.max.bytes"))
        try:
            while not sender.done():
                data = await reader.read(READ_CHUNK_BYTES)
                if not data:
                    break
                for event in connection.receive_data(data):
                    reply = self._reply_to(event)
                    if reply is not None:
                        await replies.put(reply)
        except ProtocolError as error:
            log.info("closing connection from %s: %s", peer, error)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                replies.put_nowait(None)
            await _finish(sender, writer)
            del self._connections[task]

    def _reply_to(self, event: RequestReceived | UnsupportedApiVersionsRequest) -> tuple[int, Any] | None:
        if isinstance(event, UnsupportedApiVersionsRequest):
            return event.correlation_id, unsupported_version_response()
        if not is_supported(event.api_key, event.api_version):
            if event.api_key == 18:
                return event.correlation_id, unsupported_version_response()
            raise ProtocolError(f"api {event.api_key} v{event.api_version} is not supported")
        reply = dispatch(Request(self.broker, event.api_key, event.api_version, event.header, event.body))
        if reply is None:
            return None
        if isinstance(reply, Awaitable):
            # Start waiting now, so that fsyncs of pipelined requests are shared.
            reply = asyncio.ensure_future(reply)
        return event.correlation_id, reply


async def _send_replies(
    replies: asyncio.Queue[tuple[int, Any] | None], writer: asyncio.StreamWriter, peer: Any
) -> None:
    try:
        while (item := await replies.get()) is not None:
            correlation_id, reply = item
            response = await reply if isinstance(reply, asyncio.Future) else reply
            writer.write(encode_response(correlation_id, response))
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        raise
    except Exception:
        # A reply that failed is a bug, not the client's fault: say so, as the read loop does.
        log.exception("closing connection from %s after an internal error", peer)
        writer.transport.abort()


async def _finish(sender: asyncio.Task[None], writer: asyncio.StreamWriter) -> None:
    # Responses already computed are still sent before the connection closes.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(sender, timeout=5)
    sender.cancel()
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
