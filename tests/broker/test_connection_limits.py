"""Kafka's connection limits: idle connections closed (a frame left half-sent with them), at most
`max.connections.per.ip` from one address, `queued.max.request.bytes` of large frames held at once,
and clients refused before they take the descriptors the logs need, with one log line a while."""

from __future__ import annotations

import contextlib
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from tests.conftest import BrokerProcess, wait_until
from tests.wire import WireClient

IDLE_MS = 800
PER_IP = 6
QUEUED_BYTES = 8 << 20


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("limits"),
        settings={
            "connections.max.idle.ms": str(IDLE_MS),
            "max.connections.per.ip": str(PER_IP),
            "queued.max.request.bytes": str(QUEUED_BYTES),
        },
    ).start()
    yield process
    process.terminate()


def _connect(broker: BrokerProcess) -> socket.socket:
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_by_broker(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _served(broker: BrokerProcess) -> bool:
    try:
        with WireClient(broker.bootstrap_servers) as wire:
            answer = wire.request(18, 3, client_software_name="probe", client_software_version="1")
    except OSError:
        return False  # refused: a connection closed a moment ago is still counted
    return bool(answer.error_code == ErrorCode.none)


def _hold(broker: BrokerProcess, held: list[WireClient]) -> bool:
    client = WireClient(broker.bootstrap_servers)
    try:
        client.request(18, 3, client_software_name="held", client_software_version="1")
    except OSError:
        client.close()
        return False
    held.append(client)
    return True


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_an_idle_connection_and_a_half_sent_frame_are_closed(broker: BrokerProcess) -> None:
    silent = _connect(broker)
    half_sent = _connect(broker)
    half_sent.sendall(struct.pack(">i", 40 << 20) + b"\0" * (1 << 20))  # 1 MiB of a 40 MiB frame
    started = time.monotonic()
    assert _closed_by_broker(silent, 10) and _closed_by_broker(half_sent, 10)
    assert time.monotonic() - started >= IDLE_MS / 1000 * 0.9
    with WireClient(broker.bootstrap_servers) as busy:  # one that keeps asking stays open
        for _ in range(int(2 * IDLE_MS / 100)):
            busy.request(18, 3, client_software_name="busy", client_software_version="1")
            time.sleep(0.1)  # the client's own pace, not a wait for the broker


def test_connections_past_the_per_ip_limit_are_closed_at_once(broker: BrokerProcess) -> None:
    held: list[WireClient] = []
    try:
        for _ in range(PER_IP):  # a connection the last test closed may take a moment to go
            wait_until(lambda: _hold(broker, held), 10)
        extra = _connect(broker)
        assert _closed_by_broker(extra, 5)
    finally:
        for client in held:
            client.close()
    wait_until(lambda: _served(broker), 10)


def test_large_frames_past_the_queued_bytes_wait_unread(broker: BrokerProcess) -> None:
    assert broker.process is not None
    before = _rss(broker.process.pid)
    senders = [_connect(broker) for _ in range(PER_IP - 1)]
    try:
        for sender in senders:  # each announces 16 MiB and sends 4 MiB of it
            sender.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sender.send(struct.pack(">i", 16 << 20) + b"\0" * (4 << 20))
        # Only the first frame's bytes are read: the others wait in their sockets.
        grown = _rss(broker.process.pid) - before
        assert grown < 3 * (4 << 20), f"the broker took {grown >> 20} MiB"
        first, second = senders[0], senders[1]
        first.close()  # its memory goes back: the next frame is read
        second.settimeout(20)
        second.sendall(b"\xff" * (12 << 20))  # the rest of it, garbage: read, refused, closed
        assert _closed_by_broker(second, 20)
    finally:
        for sender in senders:
            sender.close()


def test_clients_past_the_descriptor_headroom_are_refused_and_logged_once(tmp_path: Path) -> None:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (150, 150))

    log_path = tmp_path / "broker.log"
    command = [sys.executable, "-m", "onceflow.cli", "broker", "--listen", "127.0.0.1:0"]
    command += ["--data-dir", str(tmp_path / "data")]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=limit)
    try:
        assert process.stdout is not None
        address = process.stdout.readline().rsplit(" ", 1)[1].strip()
        host, port = address.rsplit(":", 1)
        with WireClient(address) as early:
            assert early.create_topic("kept", 1) == ErrorCode.none
            flood = [socket.create_connection((host, int(port)), timeout=10) for _ in range(200)]
            refused = sum(_closed_by_broker(sock, 5) for sock in flood[-20:])
            for sock in flood:
                sock.close()
            assert refused == 20
            # The client that came first is still served, and the broker can still open files.
            assert early.create_topic("made-after", 1) == ErrorCode.none
        refusals = [line for line in log_path.read_text().splitlines() if "refusing a connection" in line]
        assert 1 <= len(refusals) <= 3, refusals
    finally:
        process.kill()
        process.wait(30)
