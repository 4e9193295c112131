"""What a fetch answer's bytes cost to send on this machine: read then send, or sendfile.

    .venv/bin/python benchmarks/sendfile_probe.py [--megabytes 256] [--rounds 3]

A file of `--megabytes` random bytes (in the system's temp dir, so in its page cache after the
first pass) goes to a reader over TCP on 127.0.0.1, in 1 MiB pieces as a broker answers fetches:
either `os.pread` then `socket.sendall` (the page cache copied into a buffer, the buffer into
the socket), or `os.sendfile` (the kernel hands the socket the file's pages).
The two ways alternate, each passing over the file 8 times per round. Prints the sender
thread's CPU ms per MB (on loopback it also does the receiving side's TCP work), the whole
process's (the reader's copies out of the socket too) and the wall time, per way and round,
then the medians and their ratio sendfile / read-then-send as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

PIECE = 1 << 20
PASSES = 8


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    size = args.megabytes * PIECE
    figures: dict[str, list[dict[str, float]]] = {"read-then-send": [], "sendfile": []}
    with tempfile.NamedTemporaryFile(prefix="onceflow-sendfile-") as file:
        for _ in range(args.megabytes):
            file.write(os.urandom(PIECE))
        file.flush()
        ways: dict[str, Callable[[socket.socket, int, int], None]] = {
            "read-then-send": lambda sock, offset, count: sock.sendall(
                os.pread(file.fileno(), count, offset)
            ),
            "sendfile": lambda sock, offset, count: _sendfile_all(sock, file.fileno(), offset, count),
        }
        for round_ in range(args.rounds):
            for way in ways if round_ % 2 == 0 else reversed(ways):
                figures[way].append(_send_file(ways[way], size))
                print(way, figures[way][-1], flush=True)
    medians = {
        way: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        for way, runs in figures.items()
    }
    ratios = {key: medians["sendfile"][key] / medians["read-then-send"][key] for key in medians["sendfile"]}
    print(json.dumps({"runs": figures, "medians": medians, "sendfile_vs_read_then_send": ratios}))
    return 0


def _sendfile_all(sock: socket.socket, fd: int, offset: int, count: int) -> None:
    while count:
        sent = os.sendfile(sock.fileno(), fd, offset, count)
        offset, count = offset + sent, count - sent


def _send_file(send: Callable[[socket.socket, int, int], None], size: int) -> dict[str, float]:
    """`PASSES` passes over the file through `send`, to a reader thread; CPU and wall times."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        receiver = socket.create_connection(server.getsockname())
        sender, _ = server.accept()
    total = size * PASSES
    reader = threading.Thread(target=_read, args=(receiver, total))
    reader.start()
    process_before, thread_before, wall_before = time.process_time(), time.thread_time(), time.perf_counter()
    for _ in range(PASSES):
        for offset in range(0, size, PIECE):
            send(sender, offset, min(PIECE, size - offset))
    thread_cpu = time.thread_time() - thread_before
    reader.join()
    process_cpu, wall = time.process_time() - process_before, time.perf_counter() - wall_before
    sender.close()
    receiver.close()
    megabytes = total / 1e6
    return {
        "sender_cpu_ms_per_mb": round(thread_cpu / megabytes * 1e3, 4),
        "process_cpu_ms_per_mb": round(process_cpu / megabytes * 1e3, 4),
        "wall_s": round(wall, 3),
    }


def _read(sock: socket.socket, total: int) -> None:
    buffer = bytearray(PIECE)
    received = 0
    while received < total:
        received += sock.recv_into(buffer)


if __name__ == "__main__":
    raise SystemExit(main())
