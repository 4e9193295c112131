"""Ports for brokers that are killed and started again on the same port.

A port the kernel picks for a listener (port 0) comes from its ephemeral range, which is also
where clients' outgoing connections get their local ports; once the broker is killed, a client
connection may take its port, and the restart fails with EADDRINUSE (seen once in a test suite
running three workers). A free port below that range is never handed out that way.

A port free when it is picked can still be bound by another process before the broker binds it
(seen once with three test workers starting brokers, ZooKeepers and PostgreSQL side by side), so a
first start that fails on a port now in use tries another.
"""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_BELOW_RANGE = 10_000  # how far below the ephemeral range to look


def restartable_port(host: str = "127.0.0.1") -> int:
    """A port free right now below the ephemeral range, or 0 (the kernel's pick) if none is found."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    candidates = random.sample(range(max(1024, low - _BELOW_RANGE), low), 50)
    return next((port for port in candidates if not in_use(port, host)), 0)


def in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether binding `port` on `host` fails right now because something else holds it."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def start_on_a_restartable_port(start: Callable[[int], T], attempts: int = 5, host: str = "127.0.0.1") -> T:
    """`start(port)` on a restartable port; when it raises and another process holds that port by
    then, again on another. Any other failure is raised at once."""
    for _ in range(attempts - 1):
        port = restartable_port(host)
        try:
            return start(port)
        except Exception:
            if not port or not in_use(port, host):
                raise
    return start(restartable_port(host))
