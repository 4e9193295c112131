"""The broker's produce and consume hot paths: two source trees side by side, with a profile of each.

    .venv/bin/python benchmarks/profile_hot_paths.py --baseline OLD_SRC [--rounds 2] [--top 12]

OLD_SRC is the `src` directory of another checkout (e.g. `git archive <commit> src | tar -x -C
/tmp/old`); the other side is this checkout's `src`. Each side runs `onceflow broker` as its
own process (PYTHONPATH set to its tree). Per round and side, alternately (before, after, after,
before, ...): a fresh broker, produce `--megabytes` of 1000-byte and a fifth as much of 100-byte
records (4 partitions, acks=all, idempotent, linger.ms=5, `client.py produce`), then consume
both back (`client.py consume`). Then once per side the same load through a broker under
cProfile, whose top entries by own time are printed.

Also times the log's read path alone, in-process on each tree (`_READ_TIMING`).

Prints the median MB/s per side and figure with the ratios after / before, and the MB produced
plus consumed per second of the broker process's CPU time (start-up included), then the profiles,
and writes everything to benchmarks/results/profile-<UTC timestamp>.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from processes import BENCHMARKS_DIR, BrokerProcess, run_client

MB = 1_000_000
PARTITIONS = 4
SRC = BENCHMARKS_DIR.parent / "src"
FIGURES = ("produce-1000", "produce-100", "consume-1000", "consume-100", "per-cpu-second")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, required=True, help="the src directory of the old tree")
    parser.add_argument("--megabytes", type=int, default=100, help="of 1000-byte records per produce")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    sides = {"before": args.baseline.resolve(), "after": SRC.resolve()}
    sizes = {1000: args.megabytes * MB, 100: args.megabytes * MB // 5}
    rates: dict[str, dict[str, list[float]]] = {side: {figure: [] for figure in FIGURES} for side in sides}
    profiles: dict[str, dict[str, list[str]]] = {}
    with tempfile.TemporaryDirectory(prefix="onceflow-profile-") as tmp:
        work = Path(tmp)
        order = [
            side for round_ in range(args.rounds) for side in (sides if round_ % 2 == 0 else reversed(sides))
        ]
        for run, side in enumerate(order):
            for figure, rate in _load(work / f"run-{run}", sides[side], sizes, None).items():
                rates[side][figure].append(rate)
                print(f"  {side} {figure}: {rate:.1f} MB/s", file=sys.stderr)
        timings: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for side in [*sides, *reversed(sides)]:
            timings[side].append(_read_timings(sides[side]))
        reads = {side: {key: min(t[key] for t in runs) for key in runs[0]} for side, runs in timings.items()}
        for side, src in sides.items():
            profile = work / f"{side}.prof"
            _load(work / f"profiled-{side}", src, sizes, profile)
            profiles[side] = _top_entries(profile, src, args.top)
    medians = {side: {figure: statistics.median(rates[side][figure]) for figure in FIGURES} for side in sides}
    report: dict[str, Any] = {
        "sides": {side: str(src) for side, src in sides.items()},
        "sizes_bytes": sizes,
        "rounds": args.rounds,
        "mb_per_s": rates,
        "medians": medians,
        "ratios": {figure: medians["after"][figure] / medians["before"][figure] for figure in FIGURES},
        "log_reads_us": reads,
        "profiles": profiles,
        "load_average": os.getloadavg(),
    }
    for figure in FIGURES:
        before, after = medians["before"][figure], medians["after"][figure]
        print(f"{figure:14} before {before:7.1f} MB/s  after {after:7.1f} MB/s  ratio {after / before:.2f}")
    for key in reads["before"]:
        before, after = reads["before"][key], reads["after"][key]
        print(f"log {key:28} before {before:7.1f}  after {after:7.1f}  ratio {after / before:.2f}")
    for side, entries in profiles.items():
        for name, lines in entries.items():
            print(f"\n{side}: top {args.top} by own time (tottime), {name}")
            print("\n".join(lines))
    results = BENCHMARKS_DIR / "results"
    results.mkdir(exist_ok=True)
    path = results / f"profile-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


# In-process, no sockets: the log's read path alone, on 100-byte records in batches of 10,
# read from 500 offsets spread over the log; best of 5 rounds, microseconds per read. The
# read_committed figure adds what a read_committed Fetch also needs, the offset after the
# batches read (a second walk over them where the log does not return it).
_READ_TIMING = """
import json, sys, tempfile, time
from pathlib import Path
from onceflow.log.batch import encode_batch, validate_batches
from onceflow.log.config import LogConfig
from onceflow.log.log import PartitionLog

with tempfile.TemporaryDirectory() as tmp:
    log = PartitionLog.open(Path(tmp), LogConfig(), 0, 0)
    for _ in range(20_000):
        batch = encode_batch([(None, bytes(100))] * 10, 0)
        log.append(batch, validate_batches(batch), 0)
    offsets = range(0, log.log_end_offset, log.log_end_offset // 500)
    if hasattr(log, "read_batches"):
        committed = lambda offset, max_bytes: log.read_batches(offset, max_bytes).next_offset
    else:
        from onceflow.log.batch import next_offset_after
        committed = lambda offset, max_bytes: next_offset_after(log.read(offset, max_bytes))
    figures = {}
    for name, read, max_bytes in (
        ("read 1024 KiB", log.read, 1 << 20),
        ("read 16 KiB", log.read, 16 << 10),
        ("read_committed 1024 KiB", committed, 1 << 20),
    ):
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            for offset in offsets:
                read(offset, max_bytes)
            best = min(best, (time.perf_counter() - started) / len(offsets) * 1e6)
        figures[f"{name}, us"] = best
    log.close()
print(json.dumps(figures))
"""


# In-process, no sockets: a produced payload's way from the bytes read to the log, as the
# server and the Produce handler take it: reads of up to 256 KiB, each request's batch
# CRC-checked and appended (on a tree whose log patches batches in place, after the copy its
# Produce handler makes). A read is made as the tree's server makes it: into the buffer
# `Connection.get_buffer()` offers where the tree has it, else as bytes for `receive_data`; both
# copy each read once, in place of the socket's copy. Requests of one 1 MB batch (1000-byte
# records) and of one 16 KB batch (100-byte records); best of 5 rounds, CPU microseconds per MB
# of requests (CPU time: steadier than wall time on a shared machine), reads and decoding apart
# from the rest.
_PRODUCE_TIMING = """
import inspect, json, tempfile, time
from pathlib import Path
from kio.index import load_request_schema
from onceflow.log.batch import encode_batch, validate_batches
from onceflow.log.config import LogConfig
from onceflow.log.log import PartitionLog
from onceflow.protocol.build import build
from onceflow.protocol.codec import encode_request
from onceflow.protocol.connection import Connection

in_place = "leader_epoch" not in inspect.signature(PartitionLog.append).parameters
request_class = load_request_schema(0, 9)
header_class = request_class.__header_schema__
figures = {}
for name, record_size, records in (("1 MB requests", 1000, 1000), ("16 KB requests", 100, 160)):
    batch = bytes(encode_batch([(None, bytes(record_size))] * records, 0))
    body = build(request_class, {
        "transactional_id": None, "acks": -1, "timeout": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": batch}]}],
    })
    header = header_class(request_api_key=0, request_api_version=9, correlation_id=1, client_id="t")
    frame = encode_request(header, body)
    stream = memoryview(frame * max(1, (64 << 20) // len(frame) // 8))
    best_receive = best_append = float("inf")
    for _ in range(5):
        connection = Connection(100 << 20)
        started = time.process_time()
        events = []
        at = 0
        while at < len(stream):
            if hasattr(connection, "get_buffer"):
                buffer = connection.get_buffer()
                count = min(len(buffer), 256 << 10, len(stream) - at)
                buffer[:count] = stream[at : at + count]
                events += connection.buffer_updated(count)
            else:
                count = min(256 << 10, len(stream) - at)
                events += connection.receive_data(bytes(stream[at : at + count]))
            at += count
        best_receive = min(best_receive, time.process_time() - started)
        with tempfile.TemporaryDirectory() as tmp:
            log = PartitionLog.open(Path(tmp), LogConfig(), 0, 0)
            started = time.process_time()
            for event in events:
                payload = event.body.topic_data[0].partition_data[0].records
                headers = validate_batches(payload)
                log.append(bytearray(payload) if in_place else payload, headers, 0)
            best_append = min(best_append, time.process_time() - started)
            log.close()
    megabytes = len(stream) / 1e6
    figures[f"reads and decoding, {name}, CPU us per MB"] = best_receive / megabytes * 1e6
    figures[f"validate and append, {name}, CPU us per MB"] = best_append / megabytes * 1e6
print(json.dumps(figures))
"""


def _read_timings(src: Path) -> dict[str, float]:
    return {**_timings(src, _READ_TIMING), **_timings(src, _PRODUCE_TIMING)}


def _timings(src: Path, script: str) -> dict[str, float]:
    finished = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(src)},
        check=True,
    )
    figures: dict[str, float] = json.loads(finished.stdout)
    return figures


def _load(work: Path, src: Path, sizes: dict[int, int], profile: Path | None) -> dict[str, float]:
    """Produce then consume every record size through a fresh broker running `src`."""
    work.mkdir()
    argv = [sys.executable]
    if profile is not None:
        argv += ["-m", "cProfile", "-o", str(profile)]
    argv += ["-m", "onceflow.cli", "broker", "--listen", "127.0.0.1:0", "--data-dir", str(work / "data")]
    argv += ["--set", f"num.partitions={PARTITIONS}"]
    rates = {}
    with BrokerProcess("onceflow broker", argv, work / "broker.log", {"PYTHONPATH": str(src)}) as broker:
        broker.start()
        for record_size, total in sizes.items():
            options = {
                "bootstrap": broker.bootstrap,
                "topic": f"produce-{record_size}",
                "partitions": PARTITIONS,
            }
            figures = run_client(
                "produce",
                {**options, "record_size": record_size, "records": total // record_size, "linger_ms": 5},
                600,
                work,
            )
            rates[f"produce-{record_size}"] = figures["bytes"] / figures["seconds"] / MB
        for record_size, total in sizes.items():
            options = {
                "bootstrap": broker.bootstrap,
                "topic": f"produce-{record_size}",
                "partitions": PARTITIONS,
            }
            figures = run_client("consume", {**options, "min_bytes": total}, 600, work)
            rates[f"consume-{record_size}"] = figures["bytes"] / figures["seconds"] / MB
        # The broker's own CPU time is steadier than MB/s on a shared machine: other load slows
        # a run far more than it adds to the broker's work.
        moved = 2 * sum(sizes.values())
        rates["per-cpu-second"] = moved / broker.cpu_seconds() / MB
        broker.stop()  # SIGTERM: a clean exit, on which cProfile writes its file
    return rates


def _top_entries(profile: Path, src: Path, top: int) -> dict[str, list[str]]:
    """The top entries by own time: all of them (the event loop's idle wait included), and
    onceflow's own functions."""
    site_packages = str(Path(pstats.__file__).parent)
    entries = {}
    for name, restrictions in (("all", ()), ("onceflow", ("onceflow/",))):
        out = io.StringIO()
        pstats.Stats(str(profile), stream=out).sort_stats("tottime").print_stats(*restrictions, top)
        lines = out.getvalue().splitlines()
        header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        entries[name] = [
            line.replace(str(src), "src").replace(site_packages + "/", "")
            for line in lines[header : header + top + 1]
        ]
    return entries


if __name__ == "__main__":
    raise SystemExit(main())
