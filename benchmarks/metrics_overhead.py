"""The cost of metrics on the produce path: the same load through a broker with and without them.

    .venv/bin/python benchmarks/metrics_overhead.py [--megabytes 200] [--runs 4] [--linger-ms 5]

The broker runs in this process, on its main thread, as `onceflow broker` runs it; the load
comes from `client.py produce` in a process of its own (1 KB records, acks=all, idempotent, a
fresh 4-partition topic per run). With metrics on, a thread scrapes /metrics every
`--scrape-interval` seconds (default 1, a busy Prometheus). After one short warm-up run per
side, runs alternate (off, on, on, off, ...).

Prints, as one JSON line, per side the median MB/s, the CPU seconds per GB of the event loop's
thread (requests, hooks and scrapes run there) and of the whole process (the fsync threads too),
and the on / off ratios. On a shared machine the CPU figures are the ones to read: other load
slows a run down far more than it adds to the broker's own CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processes import CLIENT_SCRIPT

from onceflow.broker.config import BrokerConfig
from onceflow.broker.core import Broker
from onceflow.server import BrokerServer

PARTITIONS = 4
RECORD_SIZE = 1000


@dataclass(frozen=True)
class Measured:
    mb_s: float
    loop_cpu_s_per_gb: float
    process_cpu_s_per_gb: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=200, help="per run")
    parser.add_argument("--runs", type=int, default=4, help="per side")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds")
    args = parser.parse_args()
    # Unrecorded: the first runs of a process pay for imports and caches filled once.
    warm_up = argparse.Namespace(**{**vars(args), "megabytes": max(1, args.megabytes // 10)})
    for metrics in (False, True):
        asyncio.run(_produce_once(metrics, warm_up))
    runs: dict[bool, list[Measured]] = {False: [], True: []}
    for index in range(2 * args.runs):
        metrics = index % 4 in (1, 2)  # off, on, on, off, ...
        runs[metrics].append(asyncio.run(_produce_once(metrics, args)))
    results: dict[str, Any] = {"megabytes": args.megabytes, "linger_ms": args.linger_ms}
    for field in ("mb_s", "loop_cpu_s_per_gb", "process_cpu_s_per_gb"):
        off = statistics.median(getattr(run, field) for run in runs[False])
        on = statistics.median(getattr(run, field) for run in runs[True])
        results[field] = {"off": off, "on": on, "ratio": on / off}
    results["runs"] = {
        side: [vars(run) for run in runs[metrics]] for side, metrics in (("off", False), ("on", True))
    }
    print(json.dumps(results), flush=True)
    return 0


async def _produce_once(metrics: bool, args: argparse.Namespace) -> Measured:
    data_dir = Path(tempfile.mkdtemp(prefix="onceflow-metrics-bench-"))
    try:
        broker = Broker(data_dir, BrokerConfig({"num.partitions": str(PARTITIONS)}), metrics=metrics)
        server = BrokerServer(broker, "127.0.0.1", 0, ("127.0.0.1", 0) if metrics else None)
        await server.start()
        stop_scraping = threading.Event()
        scraper = None
        if server.metrics_address is not None:
            host, port = server.metrics_address
            url = f"http://{host}:{port}/metrics"
            scraper = threading.Thread(target=_scrape, args=(url, args.scrape_interval, stop_scraping))
            scraper.start()
        loop_cpu, process_cpu = time.thread_time(), time.process_time()
        try:
            figures = await _run_client(server, args)
        finally:
            stop_scraping.set()
            if scraper is not None:
                scraper.join()
        loop_cpu, process_cpu = time.thread_time() - loop_cpu, time.process_time() - process_cpu
        await server.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    gigabytes = figures["bytes"] / 1e9
    return Measured(
        figures["bytes"] / figures["seconds"] / 1e6, loop_cpu / gigabytes, process_cpu / gigabytes
    )


async def _run_client(server: BrokerServer, args: argparse.Namespace) -> dict[str, Any]:
    host, port = server.address
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CLIENT_SCRIPT),
        "produce",
        *("--bootstrap", f"{host}:{port}", "--topic", "load", "--partitions", str(PARTITIONS)),
        *("--record-size", str(RECORD_SIZE), "--records", str(args.megabytes * 1_000_000 // RECORD_SIZE)),
        *("--linger-ms", str(args.linger_ms)),
        stdout=subprocess.PIPE,
    )
    try:
        output, _ = await asyncio.wait_for(client.communicate(), 600)
    except TimeoutError:
        client.kill()
        raise
    if client.returncode != 0:
        raise SystemExit(f"client.py produce failed ({client.returncode})")
    figures: dict[str, Any] = json.loads(output.decode().strip().splitlines()[-1])
    return figures


def _scrape(url: str, interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()


if __name__ == "__main__":
    raise SystemExit(main())
