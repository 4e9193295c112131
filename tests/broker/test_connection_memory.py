"""What one connection may cost the broker in memory: not the sizes its requests announce, and
not the requests it sends while its answers are backed up."""

from __future__ import annotations

import select
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


def test_requests_behind_a_full_connection_wait_in_the_socket(broker_process: BrokerProcess) -> None:
    """70 long polls fill a connection's 64 slots; 4 MB Produce requests follow on it. The broker
    reads ahead at most MAX_WAITING_BYTES of them, then stops reading: the client's sends stall.
    Counting only the waiting requests (64, of any size) let all 30 in (the control)."""
    assert broker_process.process is not None
    pid = broker_process.process.pid
    with WireClient(broker_process.bootstrap_servers) as client:
        client.create_topic("quiet", 1)
        before = _rss_bytes(pid)
        with WireClient(broker_process.bootstrap_servers) as full:
            full.send_raw(
                b"".join(full.fetch_frame({"quiet": [0]}, max_wait=60_000, min_bytes=1) for _ in range(70))
            )
            topic_data = [{"name": "quiet", "partition_data": [{"index": 0, "records": bytes(4 << 20)}]}]
            produce = full.frame(0, 9, transactional_id=None, acks=-1, timeout=1000, topic_data=topic_data)[1]
            pending = memoryview(produce * 30)
            full.sock.setblocking(False)
            while pending:
                try:
                    pending = pending[full.sock.send(pending) :]
                except BlockingIOError:
                    if not select.select([], [full.sock], [], 2.0)[1]:
                        break  # not read for 2 s: the broker stopped reading
            grown = _rss_bytes(pid) - before
            assert pending, "the broker read every request"
            assert client.list_offset("quiet", 0) == 0  # and serves other connections
    assert grown < 60 * 1024 * 1024, f"the broker grew by {grown / 1e6:.0f} MB"
