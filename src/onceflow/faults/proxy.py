"""A loopback TCP proxy between Kafka clients and a broker that injects faults.

It understands Kafka framing on the way back, so a fault hits whole
responses: the request reaches the broker and is acted on, and then the
response is thrown away and the client's connection reset. The client sees
a lost ack and retries, which is fault (A) of the seed documents.

Every fault is bounded: the proxy stops at the end of its `with` block, and
`max_faults` caps how many responses it may destroy.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType

_INT32 = struct.Struct(">i")


@dataclass
class FaultPlan:
    drop_response_probability: float = 0.0
    delay_response_s: float = 0.0
    max_faults: int = 1_000
    seed: int = 0


class FaultProxy:
    """`with FaultProxy(FaultPlan(...)) as proxy: proxy.upstream = (host, port)`.

    `on_request`, when given, sees every request frame (without its length prefix) on its way to
    the broker: the fuzzer records real clients' requests with it.
    """

    def __init__(
        self,
        plan: FaultPlan,
        upstream: tuple[str, int] | None = None,
        on_request: Callable[[bytes], None] | None = None,
    ) -> None:
        self.plan = plan
        self.upstream = upstream
        self.on_request = on_request
        self.responses_dropped = 0
        self.responses_forwarded = 0
        self._random = random.Random(plan.seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._port = 0

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    def __enter__(self) -> FaultProxy:
        started: Future[None] = Future()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(started),), daemon=True)
        self._thread.start()
        started.result(timeout=10)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def _main(self, started: Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]
        started.set_result(None)
        await self._stop.wait()
        self._server.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.upstream is None:
            client_writer.close()
            return
        try:
            broker_reader, broker_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        requests = asyncio.create_task(
            _pipe(client_reader, broker_writer)
            if self.on_request is None
            else _pipe_frames(client_reader, broker_writer, self.on_request)
        )
        responses = asyncio.create_task(self._responses(broker_reader, client_writer))
        await asyncio.wait([requests, responses], return_when=asyncio.FIRST_COMPLETED)
        for task in (requests, responses):
            task.cancel()
        for writer in (client_writer, broker_writer):
            _reset(writer)

    async def _responses(self, broker: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        while True:
            prefix = await broker.readexactly(4)
            body = await broker.readexactly(_INT32.unpack(prefix)[0])
            if self.plan.delay_response_s:
                await asyncio.sleep(self.plan.delay_response_s)
            if (
                self.responses_dropped < self.plan.max_faults
                and self._random.random() < self.plan.drop_response_probability
            ):
                self.responses_dropped += 1
                return  # the caller resets both connections: the ack is lost
            client.write(prefix + body)
            await client.drain()
            self.responses_forwarded += 1


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(256 * 1024):
        writer.write(data)
        await writer.drain()


async def _pipe_frames(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_frame: Callable[[bytes], None]
) -> None:
    while True:
        prefix = await reader.readexactly(4)
        body = await reader.readexactly(_INT32.unpack(prefix)[0])
        on_frame(body)
        writer.write(prefix + body)
        await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, as a crashed peer or a middlebox would."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
