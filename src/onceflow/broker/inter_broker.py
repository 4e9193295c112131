"""Requests one broker sends another: a follower's fetches, a transaction coordinator's markers."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from onceflow.protocol.build import build
from onceflow.protocol.codec import decode_response, encode_request, request_type

_INT32 = struct.Struct(">i")


def client_id(broker_id: int) -> str:
    return f"onceflow-broker-{broker_id}"


async def exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    sender_id: int,
    correlation_id: int,
    api_key: int,
    version: int,
    fields: dict[str, Any],
) -> Any:
    """Send one request on an open connection and return the body of its answer. Raises
    OSError or asyncio.IncompleteReadError when the connection fails, ValueError when the
    answer is not this request's."""
    body = build(request_type(api_key, version), fields)
    header = build(
        body.__header_schema__,
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id=client_id(sender_id),
    )
    writer.write(encode_request(header, body))
    await writer.drain()
    size = _INT32.unpack(await reader.readexactly(4))[0]
    answered_id, response = decode_response(api_key, version, await reader.readexactly(size))
    if answered_id != correlation_id:
        raise ValueError(f"answer {answered_id} to request {correlation_id}")
    return response


async def request_once(
    address: tuple[str, int], sender_id: int, api_key: int, version: int, fields: dict[str, Any]
) -> Any:
    """One request on a connection of its own."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        return await exchange(reader, writer, sender_id, 1, api_key, version, fields)
    finally:
        writer.close()
