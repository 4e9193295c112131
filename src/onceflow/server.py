"""The asyncio shell: sockets in, protocol events to handlers, responses out.

Requests on one connection are dispatched in arrival order, so appends keep
the client's order. Replies that must wait (fsync, long poll) run as tasks
while later requests are dispatched; each response is written, in request
order as clients expect, as soon as it and those before it are ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from onceflow import failpoints
from onceflow.apis import HANDLERS, Request, dispatch, is_supported
from onceflow.apis.api_versions import unsupported_version_response
from onceflow.apis.common import Ordered, Stamps
from onceflow.broker.core import Broker
from onceflow.broker.listeners import (
    Listener,
    advertised,
    configured_listeners,
    inter_broker_listener,
)
from onceflow.broker.metrics import STAGE_FSYNC_TO_ANSWER, Metrics
from onceflow.broker.security import ListenerSecurity
from onceflow.log_limits import once_per_interval
from onceflow.protocol.codec import OWN_PIECE_BYTES, encode_response_pieces
from onceflow.protocol.connection import (
    Connection,
    Event,
    ProtocolError,
    RequestReceived,
    SaslTokenReceived,
    UnsupportedApiVersionsRequest,
)
from onceflow.protocol.limits import ConnectionQuotas, MemoryPool
from onceflow.security.sasl_errors import AuthenticationFailed
from onceflow.security.session import IllegalSaslState, Session

log = logging.getLogger(__name__)
_refusals = once_per_interval(__name__)

MAX_IN_FLIGHT_PER_CONNECTION = 64
# Requests read but not yet started, per connection, beyond which the socket is not read: so
# many, or so many bytes of them (a client whose answers back up must not fill the broker's
# memory with requests of up to socket.request.max.bytes).
MAX_WAITING_REQUESTS = 64
MAX_WAITING_BYTES = 2 * 1024 * 1024
METRICS_REQUEST_TIMEOUT_S = 10
# Descriptors kept from clients for what the logs open besides their segments' files: a new
# segment's three, a snapshot, a directory to fsync, the metrics endpoint.
FILE_DESCRIPTORS_RESERVED = 64
FINISH_TIMEOUT_S = 5
# A TLS client that has not finished its handshake by then is let go.
TLS_HANDSHAKE_TIMEOUT_S = 10
_SIZE = struct.Struct(">i")
# A negative control of the SASL fuzz test: requests served before authentication.
_CHECK_SESSIONS = not failpoints.armed("security.serve-before-authentication")

# A reply on its way to the writer: correlation id, response (or a future of it), the stamps.
_Reply = tuple[int, Any, Stamps | None]

# Kafka's request names (produce -> Produce, init_producer_id -> InitProducerId), for metrics.
API_NAMES = {
    key: "".join(word.title() for word in module.__name__.rsplit(".", 1)[1].split("_"))
    for key, module in HANDLERS.items()
}


class BrokerServer:
    def __init__(
        self,
        broker: Broker,
        listen: tuple[str, int] | None,
        metrics_address: tuple[str, int] | None = None,
    ) -> None:
        """Serves the broker's `listeners`, or one PLAINTEXT listener on `listen`.
        `metrics_address` serves Prometheus metrics over HTTP; the broker must record them.
        Raises ConfigError for listeners or security settings that cannot work."""
        if metrics_address is not None and broker.metrics.registry is None:
            raise ValueError("serving metrics needs a Broker made with metrics=True")
        self.broker = broker
        self.listeners = configured_listeners(broker.config, listen)
        self._security = [broker.security.listener(listener) for listener in self.listeners]
        self._inter_broker = inter_broker_listener(broker.config, self.listeners)
        self._inter_broker_client = (
            broker.security.inter_broker_client(self._inter_broker) if broker.cluster is not None else None
        )
        self._servers: dict[str, asyncio.Server] = {}
        self._metrics_address = metrics_address
        self._metrics_server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], _InOrderReplies] = {}
        config = broker.config
        self._memory = MemoryPool(config.get_int("queued.max.request.bytes"))
        self._quotas = ConnectionQuotas(
            config.get_int("max.connections"),
            config.get_int("max.connections.per.ip"),
            self._room_for_connections,
        )
        self._idle_s = config.get_int("connections.max.idle.ms") / 1000
        self._clients: set[_ClientProtocol] = set()
        self._idle_sweep: asyncio.Task[None] | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The first listener's bound address."""
        return self.addresses[self.listeners[0].name]

    @property
    def addresses(self) -> dict[str, tuple[str, int]]:
        """Each listener's bound address, by listener name."""
        bound = {}
        for name, server in self._servers.items():
            host, port = server.sockets[0].getsockname()[:2]
            bound[name] = (host, port)
        return bound

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        if self._metrics_server is None:
            return None
        host, port = self._metrics_server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> None:
        if self._metrics_address is not None:
            host, port = self._metrics_address
            try:
                self._metrics_server = await asyncio.start_server(self._serve_metrics, host, port)
            except OSError as error:
                raise OSError(error.errno, f"metrics on {host}:{port}: {error.strerror or error}") from error
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_quiet_accept_errors)
        try:
            for listener, security in zip(self.listeners, self._security, strict=True):
                self._servers[listener.name] = await _listen(loop, listener, partial(self._accept, security))
        except BaseException:
            if self._metrics_server is not None:
                self._metrics_server.close()
            for server in self._servers.values():
                server.close()
            raise
        endpoints = advertised(self.broker.config, self.listeners, self.addresses)
        self.broker.start(endpoints, self._inter_broker.name, self._inter_broker_client)
        self._idle_sweep = asyncio.create_task(self._close_idle_connections(), name="idle-connections")
        await self.broker.join_cluster()

    async def stop(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
        for server in self._servers.values():
            server.close()
        if self._idle_sweep is not None:
            self._idle_sweep.cancel()
        # Aborting the connections ends their read loops, which then clean up; one waiting for
        # room among its replies does not wait for them to finish.
        for replies in self._connections.values():
            replies.abandon()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self.broker.stop()

    def _accept(self, security: ListenerSecurity) -> _ClientProtocol:
        connection = Connection(self.broker.config.get_int("socket.request.max.bytes"), pool=self._memory)
        return _ClientProtocol(connection, self._serve, self._admit, self._memory, security)

    def _admit(self, client: _ClientProtocol, peer: Any) -> bool:
        """Count a new connection against the quotas, or refuse it (closed at once, as Kafka's)."""
        ip = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        refused = self._quotas.admit(ip)
        if refused is not None:
            _refusals.warning("refusing a connection from %s: %s", ip, refused)
            return False
        self._clients.add(client)
        client.closed.add_done_callback(lambda _: self._forget(client, ip))
        return True

    def _forget(self, client: _ClientProtocol, ip: str) -> None:
        self._clients.discard(client)
        self._quotas.release(ip)

    def _room_for_connections(self) -> int:
        """How many more connections the open-file limit leaves room for: the logs' files and a
        reserve for everything else (an fsync's directory, a new segment, a snapshot) come first."""
        limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if limit == resource.RLIM_INFINITY:
            return 1
        return limit - self.broker.logs.open_files() - FILE_DESCRIPTORS_RESERVED - len(self._clients)

    async def _close_idle_connections(self) -> None:
        """Kafka's connections.max.idle.ms: a connection that sent nothing and is owed nothing for
        that long is closed, a frame it left half-sent with it (and the memory it held)."""
        while True:
            await asyncio.sleep(max(self._idle_s / 10, 0.05))
            now = time.monotonic()
            for client in list(self._clients):
                if now - client.last_active > self._idle_s and client.idle():
                    log.info("closing a connection idle for %.0f s", now - client.last_active)
                    client.close()

    async def _serve(self, client: _ClientProtocol) -> None:
        task = asyncio.current_task()
        assert task is not None and client.transport is not None
        peer = client.transport.get_extra_info("peername")
        security = client.security
        if security.ssl_context is not None and not await self._start_tls(client, security, peer):
            return
        transport = client.transport
        session = security.session(
            str(peer[0]) if isinstance(peer, tuple) else str(peer),
            transport.get_extra_info("peercert") if security.ssl_context is not None else None,
        )
        full_size = client.connection.max_request_bytes
        if session.sasl:  # frames before authentication are small, as in Kafka
            client.connection.max_request_bytes = min(full_size, security.max_receive_bytes)
        replies = _InOrderReplies(transport, peer, self.broker.metrics)
        client.replies = replies
        self._connections[task] = replies
        try:
            while not replies.failed:
                # A client that reads no answers stops being read: its requests wait in the socket.
                await client.writable.wait()
                arrived = await client.next_request()
                if arrived is None:
                    break
                await replies.room.wait()  # at most MAX_IN_FLIGHT_PER_CONNECTION started
                if replies.failed:
                    break
                event, received = arrived
                if isinstance(event, SaslTokenReceived):
                    self._raw_sasl_token(security.listener.name, session, event.token, transport)
                    client.connection.raw_frames = session.raw_tokens
                    continue
                reply, done_changing = self._reply_to(event, received, session)
                if reply is not None:
                    replies.add(reply)
                if session.sasl:
                    if session.failed:
                        break  # its SASL_AUTHENTICATION_FAILED answer goes out, then the connection closes
                    client.connection.raw_frames = session.raw_tokens
                    if session.authenticated:
                        client.connection.max_request_bytes = full_size
                if done_changing is not None:
                    await done_changing
        except ProtocolError as error:
            log.info("closing connection from %s: %s", peer, error)
        except Exception:
            _refusals.exception("closing connection from %s after an internal error", peer)
        finally:
            # Responses still coming are sent before the connection closes, for a while.
            if not transport.is_closing():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(replies.all_written.wait(), FINISH_TIMEOUT_S)
            transport.close()
            try:
                await asyncio.wait_for(asyncio.shield(client.closed), FINISH_TIMEOUT_S)
            except TimeoutError:
                transport.abort()  # a client that reads nothing keeps a closing socket open
            del self._connections[task]

    async def _start_tls(self, client: _ClientProtocol, security: ListenerSecurity, peer: Any) -> bool:
        """The TLS handshake, on a connection already counted against the quotas: whether it
        succeeded (else the connection is closed)."""
        assert client.transport is not None
        try:
            client.transport = await asyncio.get_running_loop().start_tls(
                client.transport,
                client,
                security.ssl_context,  # type: ignore[arg-type]  # checked by the caller
                server_side=True,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
            )
        except (OSError, TimeoutError, ConnectionError) as error:  # ssl.SSLError is an OSError
            self.broker.metrics.authentication(security.listener.name, succeeded=False)
            log.info("TLS handshake with %s failed: %s", peer, error)
            client.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(client.closed), FINISH_TIMEOUT_S)
            return False
        return True

    def _raw_sasl_token(
        self, listener: str, session: Session, token: bytes, transport: asyncio.BaseTransport
    ) -> None:
        """A SASL token after SaslHandshake v0: answered unframed, or the connection closes."""
        try:
            answer, _, done = session.authenticate(token)
        except (AuthenticationFailed, IllegalSaslState) as error:
            self.broker.metrics.authentication(listener, succeeded=False)
            raise ProtocolError(f"SASL authentication failed: {error}") from None
        if done:
            self.broker.metrics.authentication(listener, succeeded=True)
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_SIZE.pack(len(answer)) + answer)

    def _reply_to(
        self, event: RequestReceived | UnsupportedApiVersionsRequest, received: float, session: Session
    ) -> tuple[_Reply | None, Awaitable[None] | None]:
        """The reply to queue, and what must be done before the next request is dispatched."""
        if isinstance(event, UnsupportedApiVersionsRequest):
            return (event.correlation_id, unsupported_version_response(), None), None
        if not is_supported(event.api_key, event.api_version):
            if event.api_key == 18:
                return (event.correlation_id, unsupported_version_response(), None), None
            raise ProtocolError(f"api {event.api_key} v{event.api_version} is not supported")
        if _CHECK_SESSIONS and not session.allows(event.api_key):
            raise ProtocolError(f"api {event.api_key} before SASL authentication (or after it expired)")
        started = time.perf_counter()
        stamps = Stamps(received)
        reply = dispatch(
            Request(self.broker, event.api_key, event.api_version, event.header, event.body, stamps, session)
        )
        done_changing = None
        if isinstance(reply, Ordered):
            reply, done_changing = reply
        if isinstance(reply, Awaitable):
            # Start waiting now, so that fsyncs of pipelined requests are shared.
            reply = asyncio.ensure_future(reply)
            reply.add_done_callback(partial(self._reply_done, event.api_key, started))
        else:
            self.broker.metrics.request_finished(event.api_key, API_NAMES[event.api_key], started, reply)
        if reply is None:
            return None, done_changing
        return (event.correlation_id, reply, stamps), done_changing

    def _reply_done(self, api_key: int, started: float, reply: asyncio.Future[Any]) -> None:
        response = None if reply.cancelled() or reply.exception() is not None else reply.result()
        self.broker.metrics.request_finished(api_key, API_NAMES[api_key], started, response)

    async def _serve_metrics(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One HTTP/1.1 exchange per connection. Served on the event loop, so the collector
        reads the broker's state between requests, never while a handler changes it."""
        registry = self.broker.metrics.registry
        assert registry is not None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), METRICS_REQUEST_TIMEOUT_S)
            method, _, rest = head.partition(b" ")
            path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                status, content_type, body = "405 Method Not Allowed", "text/plain", b"GET /metrics\n"
            elif path != b"/metrics":
                status, content_type, body = "404 Not Found", "text/plain", b"see /metrics\n"
            else:
                status, content_type, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(registry)
            headers = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(headers.encode() + (body if method != b"HEAD" else b""))
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except Exception:
            log.exception("answering a metrics scrape failed")
        finally:
            writer.close()


class _InOrderReplies:
    """A connection's replies in request order. Each response is written as soon as it and
    every one before it are ready, from the callback of the reply that completes, not by a task
    awaiting it: a task would cost every waiting reply (acks=all, long polls) another turn of
    the event loop, a millisecond or more on a busy one."""

    def __init__(self, transport: asyncio.Transport, peer: Any, metrics: Metrics) -> None:
        self._transport = transport
        self._peer = peer
        self._metrics = metrics
        self._pending: deque[_Reply] = deque()
        self.room = asyncio.Event()  # set while fewer than MAX_IN_FLIGHT_PER_CONNECTION wait
        self.room.set()
        self.all_written = asyncio.Event()
        self.all_written.set()
        self.failed = False

    @property
    def pending(self) -> bool:
        """Answers owed to the client."""
        return bool(self._pending)

    def add(self, reply: _Reply) -> None:
        self._pending.append(reply)
        self.all_written.clear()
        if len(self._pending) >= MAX_IN_FLIGHT_PER_CONNECTION:
            self.room.clear()
        response = reply[1]
        if isinstance(response, asyncio.Future) and not response.done():
            response.add_done_callback(self._write_ready)
        else:
            self._write_ready()

    def _write_ready(self, _: object = None) -> None:
        ready: list[bytes | bytearray] = []  # the pieces of the answers ready, in order
        try:
            while self._pending and not self.failed:
                if self._transport.is_closing():
                    # The client is gone: what its requests still get has nowhere to go.
                    self._pending.clear()
                    break
                correlation_id, reply, stamps = self._pending[0]
                if isinstance(reply, asyncio.Future):
                    if not reply.done():
                        break
                    if reply.cancelled():  # the broker is stopping: the answers before it go first
                        self._write(ready)
                        self.abandon()
                        break
                    reply = reply.result()
                self._pending.popleft()
                ready += encode_response_pieces(correlation_id, reply)
                if stamps is not None and stamps.durable is not None:
                    self._metrics.stage(STAGE_FSYNC_TO_ANSWER, time.perf_counter() - stamps.durable)
            if not self.failed:
                self._write(ready)
        except Exception:
            # A reply that failed is a bug, not the client's fault: say so, as the read loop does.
            log.exception("closing connection from %s after an internal error", self._peer)
            self.abandon()
        if len(self._pending) < MAX_IN_FLIGHT_PER_CONNECTION:
            self.room.set()
        if not self._pending:
            self.all_written.set()

    def _write(self, pieces: list[bytes | bytearray]) -> None:
        """Answers ready together go in one write, as each write to an idle socket is a send,
        and on loopback a send also runs the receiver's side of TCP (the acks one fsync
        completes, the fetches it wakes). A records piece stays a write of its own, uncopied."""
        if not pieces or self._transport.is_closing():
            return
        small: list[bytes | bytearray] = []
        for piece in pieces:
            if len(piece) < OWN_PIECE_BYTES:
                small.append(piece)
                continue
            if small:
                self._transport.write(b"".join(small))
                small = []
            self._transport.write(piece)
        if small:
            self._transport.write(small[0] if len(small) == 1 else b"".join(small))

    def abandon(self) -> None:
        """Abort the connection: write nothing more, and let nobody wait for room."""
        self.failed = True
        self._pending.clear()
        self._transport.abort()
        self.room.set()
        self.all_written.set()


class _ClientProtocol(asyncio.BufferedProtocol):
    """A client connection's bytes, read straight into the buffers its `Connection` offers: a
    Produce request of megabytes lands in one buffer of its size instead of being copied through
    a stream reader's. The requests wait here for the connection's task (`serve`), and the
    socket is not read while MAX_WAITING_REQUESTS, or MAX_WAITING_BYTES of them, wait."""

    def __init__(
        self,
        connection: Connection,
        serve: Callable[[_ClientProtocol], Coroutine[Any, Any, None]],
        admit: Callable[[_ClientProtocol, Any], bool],
        memory: MemoryPool,
        security: ListenerSecurity,
    ) -> None:
        self.connection = connection
        self.security = security
        self._serve = serve
        self._admit = admit
        self._memory = memory
        self.last_active = time.monotonic()
        self.replies: _InOrderReplies | None = None  # set by the connection's task
        self.transport: asyncio.Transport | None = None
        # Each with the perf_counter() time at which the read that completed it ended.
        self._requests: deque[tuple[Event, float]] = deque()
        self._waiting_bytes = 0  # the frame sizes of `_requests`
        self._arrived = asyncio.Event()
        self._ended: BaseException | None = None  # a ProtocolError, or an internal error
        self._at_end = False
        self.writable = asyncio.Event()  # cleared while the socket's write buffer is full
        self.writable.set()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def next_request(self) -> tuple[Event, float] | None:
        """The next request and when it was read, None at the end of the stream; raises what
        ended the stream early."""
        while not self._requests:
            if self._at_end:
                if self._ended is not None:
                    raise self._ended
                return None
            self._arrived.clear()
            await self._arrived.wait()
        request = self._requests.popleft()
        self._waiting_bytes -= _frame_size(request[0])
        assert self.transport is not None
        if (
            not self._at_end
            and not self.transport.is_reading()
            and not self._full()
            and not self.connection.waiting_for_memory
        ):
            self.transport.resume_reading()
        return request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.security.ssl_context is not None:
            transport.pause_reading()  # the bytes are TLS's: the task hands the socket to TLS first
        if not self._admit(self, transport.get_extra_info("peername")):
            transport.abort()
            return
        asyncio.get_running_loop().create_task(self._serve(self))

    def idle(self) -> bool:
        """Nothing read and not answered: no request waits here or is being handled."""
        return not self._requests and (self.replies is None or not self.replies.pending)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _resume_when_memory_frees(self) -> None:
        if self._at_end or self.transport is None or self.transport.is_closing():
            return
        if self.connection.retry_reservation():
            if not self._full():
                self.transport.resume_reading()
        else:
            self._memory.when_released(self._resume_when_memory_frees)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.connection.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        assert self.transport is not None
        try:
            requests = self.connection.buffer_updated(nbytes)
        except Exception as error:  # a ProtocolError, or a bug: the connection's task reports it
            self._end(error)
            return
        self.last_active = time.monotonic()
        if self.connection.waiting_for_memory:
            # Its next frame does not fit queued.max.request.bytes: read no more until it does.
            self.transport.pause_reading()
            self._memory.when_released(self._resume_when_memory_frees)
        if requests:
            received = time.perf_counter()
            self._requests.extend((request, received) for request in requests)
            self._waiting_bytes += sum(map(_frame_size, requests))
            self._arrived.set()
            if self._full():
                self.transport.pause_reading()  # nothing when paused already

    def _full(self) -> bool:
        return len(self._requests) >= MAX_WAITING_REQUESTS or self._waiting_bytes >= MAX_WAITING_BYTES

    def eof_received(self) -> bool:
        self._end(None)
        # The answers still coming are written before the connection closes; TLS has no
        # half-closed connections (asyncio closes it and warns of a True here).
        return self.transport is None or self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.close()
        self._end(None)
        self.writable.set()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def _end(self, error: BaseException | None) -> None:
        if not self._at_end:
            self._at_end, self._ended = True, error
            if error is not None and self.transport is not None:
                self.transport.pause_reading()
        self._arrived.set()


def _frame_size(request: Event) -> int:
    return request.size if isinstance(request, RequestReceived) else 0


async def _listen(
    loop: asyncio.AbstractEventLoop, listener: Listener, protocol: Callable[[], _ClientProtocol]
) -> asyncio.Server:
    try:
        return await loop.create_server(protocol, listener.host, listener.port)
    except OSError as error:
        where = f"listener {listener.name} on {listener.host}:{listener.port}"
        raise OSError(error.errno, f"{where}: {error.strerror or error}") from error


def _quiet_accept_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio retries an accept that ran out of descriptors every second and logs each failure
    with its traceback: once per interval is enough to say what is wrong."""
    if context.get("message") == "socket.accept() out of system resource":
        _refusals.error("cannot accept connections: %s", context.get("exception"))
        return
    loop.default_exception_handler(context)
