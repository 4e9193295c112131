"""Raw frames to and from the broker under test: a length-prefixed read, and the liveness probe
(ApiVersions v0, which a broker answers before authentication too)."""

from __future__ import annotations

import asyncio
import contextlib
import struct

INT32 = struct.Struct(">i")
_API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 0x7EADBEEF, -1)


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    prefix = await reader.readexactly(4)
    return await reader.readexactly(INT32.unpack(prefix)[0])


async def responds(port: int, timeout_s: float) -> bool:
    """Does the broker answer an ApiVersions request on a new connection?"""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(INT32.pack(len(_API_VERSIONS_V0)) + _API_VERSIONS_V0)
        await writer.drain()
        await asyncio.wait_for(read_frame(reader), timeout_s)
        return True
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    finally:
        with contextlib.suppress(Exception):
            writer.transport.abort()
