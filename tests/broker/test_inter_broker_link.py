"""The connection a broker opens to another (`broker.inter_broker.Link`), against peers that
answer wrong: each failure reaches the caller as the error its callers handle (a follower
reconnects on OSError and ValueError), never a hang. Real answers: test_leader_fetcher.py."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import pytest

from onceflow.broker.inter_broker import MAX_ANSWER_BYTES, Link

API_VERSIONS = 18
ANSWER_TIMEOUT_S = 5


def _exchange_with(answer: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> None:
    """One ApiVersions request to a peer that reads the request and then runs `answer`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        await reader.readexactly(size)
        await answer(writer)

    async def run() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        async with server:
            link = await Link.open(server.sockets[0].getsockname()[:2], 1)
            try:
                await asyncio.wait_for(
                    link.exchange(
                        API_VERSIONS, 3, {"client_software_name": "x", "client_software_version": "1"}
                    ),
                    ANSWER_TIMEOUT_S,
                )
            finally:
                link.close()

    asyncio.run(run())


def test_an_answer_of_an_impossible_size_is_refused() -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(struct.pack(">i", MAX_ANSWER_BYTES + 1))
        await writer.drain()

    with pytest.raises(ValueError, match="an answer of"):
        _exchange_with(answer)


def test_a_connection_closed_half_way_through_an_answer_fails_the_request() -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(struct.pack(">i", 100) + b"\0" * 10)
        await writer.drain()
        writer.close()

    with pytest.raises(ConnectionError):
        _exchange_with(answer)


def test_an_answer_to_another_request_is_refused() -> None:
    async def answer(writer: asyncio.StreamWriter) -> None:
        # ApiVersions v3 answer: correlation id 7 (the request's is 1), error 0, no keys, throttle
        # 0, no tagged fields.
        frame = struct.pack(">ihbib", 7, 0, 1, 0, 0)
        writer.write(struct.pack(">i", len(frame)) + frame)
        await writer.drain()

    with pytest.raises(ValueError, match="answer 7 to request 1"):
        _exchange_with(answer)
