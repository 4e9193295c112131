"""A request's size is announced before its bytes: the broker must not spend memory on the
announcement alone."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from tests.conftest import BrokerProcess
from tests.wire import WireClient

MAX_REQUEST_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_frames_announced_at_the_largest_size_cost_only_what_arrives(broker_process: BrokerProcess) -> None:
    """Ten connections announce frames of socket.request.max.bytes and send one byte each. A
    frame buffer made whole at the announcement (zeroed) took a gigabyte (the control); the
    broker grows by what arrived, and goes on serving."""
    assert broker_process.process is not None
    pid = broker_process.process.pid
    host, port = broker_process.bootstrap_servers.split(":")
    with WireClient(broker_process.bootstrap_servers) as client:
        client.create_topic("t", 1)
        before = _rss_bytes(pid)
        announcing = [socket.create_connection((host, int(port))) for _ in range(10)]
        try:
            for connection in announcing:
                connection.sendall(struct.pack(">i", MAX_REQUEST_BYTES) + b"\0")
            for _ in range(5):  # the loop goes round, past the reads of those connections
                assert client.list_offset("t", 0) == 0
            grown = _rss_bytes(pid) - before
        finally:
            for connection in announcing:
                connection.close()
    assert grown < 50 * 1024 * 1024, f"the broker grew by {grown / 1e6:.0f} MB"
