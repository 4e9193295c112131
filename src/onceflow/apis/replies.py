"""Changing a handler's answer after the fact, whatever form it has: an entity, an awaitable of
one, an `Ordered` pair, or None (no answer)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from onceflow.apis.common import Ordered


def map_reply(reply: Any, change: Callable[[Any], Any]) -> Any:
    if reply is None:
        return None
    if isinstance(reply, Ordered):
        return Ordered(_changed(reply.reply, change), reply.done_changing)
    if isinstance(reply, Awaitable):
        return _changed(reply, change)
    return change(reply)


async def _changed(reply: Awaitable[Any], change: Callable[[Any], Any]) -> Any:
    answer = await reply
    return None if answer is None else change(answer)
