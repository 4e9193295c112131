"""The cost of `--metrics` on the produce path: the same load through a broker with and without it.

    .venv/bin/python benchmarks/metrics_overhead.py [--megabytes 200] [--runs 3]

Runs alternate (off, on, on, off, ...) so drift in the shared machine's load hits both sides
alike. While metrics are on, a thread scrapes /metrics every second, as a busy Prometheus would.
Each run produces 1 KB records, acks=all, idempotent, to a fresh 4-partition topic with
`client.py produce`, once with linger.ms=5 (the throughput scenario) and once with linger.ms=0
(small requests). Prints, as one JSON line, the median MB/s of each side and the broker's median
CPU seconds per GB produced, with their ratios (on / off). On a shared machine the CPU figure is
the steadier of the two: other load slows a run down more than it adds to the broker's CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import tempfile
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processes import onceflow_broker, run_client
from prometheus_client.parser import text_string_to_metric_families

PARTITIONS = 4
RECORD_SIZE = 1000


@dataclass(frozen=True)
class Measured:
    mb_s: float
    broker_cpu_s_per_gb: float  # the broker's user+system CPU while the client produced
    produce_requests: float  # as the broker counted them (metrics on only)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=200, help="per run")
    parser.add_argument("--runs", type=int, default=3, help="per side and linger.ms")
    args = parser.parse_args()
    records = args.megabytes * 1_000_000 // RECORD_SIZE
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="onceflow-metrics-bench-") as work:
        work_dir = Path(work)
        for linger_ms in (5, 0):
            runs: dict[bool, list[Measured]] = {False: [], True: []}
            order = [run % 4 in (1, 2) for run in range(2 * args.runs)]  # off, on, on, off, ...
            for index, metrics in enumerate(order):
                name = f"linger{linger_ms}-{index}"
                runs[metrics].append(_produce_once(work_dir, name, metrics, linger_ms, records))
            off_rate = statistics.median(run.mb_s for run in runs[False])
            on_rate = statistics.median(run.mb_s for run in runs[True])
            off_cpu = statistics.median(run.broker_cpu_s_per_gb for run in runs[False])
            on_cpu = statistics.median(run.broker_cpu_s_per_gb for run in runs[True])
            results[f"linger_ms={linger_ms}"] = {
                "off_mb_s": off_rate,
                "on_mb_s": on_rate,
                "throughput_ratio": on_rate / off_rate,
                "off_broker_cpu_s_per_gb": off_cpu,
                "on_broker_cpu_s_per_gb": on_cpu,
                "cpu_ratio": on_cpu / off_cpu,
                "produce_requests_per_mb": statistics.median(run.produce_requests for run in runs[True])
                / args.megabytes,
                "runs_off": [dataclasses.asdict(run) for run in runs[False]],
                "runs_on": [dataclasses.asdict(run) for run in runs[True]],
            }
    print(json.dumps(results), flush=True)
    return 0


def _produce_once(work_dir: Path, name: str, metrics: bool, linger_ms: int, records: int) -> Measured:
    """One produce run through a fresh broker."""
    broker = onceflow_broker(work_dir / name, {"num.partitions": str(PARTITIONS)}, work_dir)
    metrics_port = _free_port()
    if metrics:
        broker.argv += ["--metrics", f"127.0.0.1:{metrics_port}"]
    stop_scraping = threading.Event()
    with broker:
        broker.start()
        scraper = None
        if metrics:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            scraper = threading.Thread(target=_scrape_every_second, args=(url, stop_scraping))
            scraper.start()
        cpu_before = _cpu_seconds(broker.pid)
        try:
            figures = run_client(
                "produce",
                {
                    "bootstrap": broker.bootstrap,
                    "topic": name,
                    "partitions": PARTITIONS,
                    "record_size": RECORD_SIZE,
                    "records": records,
                    "linger_ms": linger_ms,
                },
                600,
                work_dir,
            )
        finally:
            stop_scraping.set()
            if scraper is not None:
                scraper.join()
        cpu = _cpu_seconds(broker.pid) - cpu_before
        requests = _produce_requests(f"http://127.0.0.1:{metrics_port}/metrics") if metrics else 0.0
        broker.stop()
    return Measured(figures["bytes"] / figures["seconds"] / 1e6, cpu / (figures["bytes"] / 1e9), requests)


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process and its threads so far."""
    # The fields after the command name, which is in parentheses and may hold spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    # Another process could take it before the broker binds it: good enough for a benchmark.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _produce_requests(url: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "kafka_network_requestmetrics_requests_total"
                and sample.labels["request"] == "Produce"
            ):
                return sample.value
    return 0.0


def _scrape_every_second(url: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()


if __name__ == "__main__":
    raise SystemExit(main())
