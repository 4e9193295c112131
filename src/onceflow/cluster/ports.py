"""Ports for brokers that are killed and started again on the same port.

A port the kernel picks for a listener (port 0) comes from its ephemeral range, which is also
where clients' outgoing connections get their local ports; once the broker is killed, a client
connection may take its port, and the restart fails with EADDRINUSE (seen once in a test suite
running three workers). A free port below that range is never handed out that way.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_BELOW_RANGE = 10_000  # how far below the ephemeral range to look


def restartable_port(host: str = "127.0.0.1") -> int:
    """A port free right now below the ephemeral range, or 0 (the kernel's pick) if none is found."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    candidates = random.sample(range(max(1024, low - _BELOW_RANGE), low), 50)
    for port in candidates:
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    return 0
