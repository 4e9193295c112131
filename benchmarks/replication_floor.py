"""How low the replication scenario's CPU ratio (issue 39: at most 3.0 x one broker) could go.

    .venv/bin/python benchmarks/replication_floor.py [--megabytes 300] [--rounds 5]

Run on its own, not by `run.py`; needs `perf` (root, or perf_event_paranoid <= 1). One broker and
a 3-broker cluster are up at once and take the scenario's produce load in turn (1 KB records,
acks=all, idempotent, 4 partitions), the order reversed every round, each into a topic of its own
deleted after it: the cluster at replication factor 3 and at replication factor 1, both with their
leaders spread over the brokers as the scenario's are, and the lone broker. For each: every
broker's user and system CPU from /proc, and `perf record` of every broker, whose samples in
libpython are its interpreter's share. Prints, per round, each side's CPU per acknowledged MB and
these ratios to one broker's CPU, then their medians; everything goes to
benchmarks/results/replication-floor-<UTC timestamp>.json.
- `ratio`: the scenario's row; `unreplicated_ratio`: the cluster at replication factor 1;
- `kernel_only`: the cluster's system time alone (replication factor 3);
- `replication_kernel_only`: the unreplicated cluster plus what replication adds in system time,
  as if replicating cost no user time at all;
- `without_replication_python`: the cluster less what replication adds in interpreter time, as if
  replication were native code doing what the Python does now (its C parts, CRC32C, kept);
- `without_extra_python`: the cluster less all its interpreter time beyond one broker's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from processes import (
    BENCHMARKS_DIR,
    BrokerProcess,
    OnceflowCluster,
    delete_topic,
    onceflow_broker,
    run_client,
)

MB = 1_000_000
PARTITIONS = 4
CLUSTER_SIZE = 3
_DSO_LINE = re.compile(r"\s*([\d.]+)%\s+(\S+)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--megabytes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("replication_floor: needs `perf` on the PATH", file=sys.stderr)
        return 2
    started = datetime.now(UTC)
    work = Path(tempfile.mkdtemp(prefix="onceflow-replication-floor-"))
    settings = {"num.partitions": str(PARTITIONS)}
    rounds: list[dict[str, Any]] = []
    with (
        onceflow_broker(work / "single", settings, work) as single,
        OnceflowCluster(CLUSTER_SIZE, work / "cluster", settings, work) as cluster,
    ):
        single.start()
        cluster.start()
        for number in range(args.rounds):
            topic = f"floor-{number}"
            sides: dict[str, dict[str, float]] = {}
            turn = [
                ("cluster", cluster.bootstrap, list(cluster.brokers.values()), cluster.data_dir),
                ("single", single.bootstrap, [single], work / "single"),
                ("unreplicated", cluster.bootstrap, list(cluster.brokers.values()), cluster.data_dir),
            ]
            for side, bootstrap, brokers, data_dir in turn if number % 2 == 0 else reversed(turn):
                if side != "single":
                    cluster.create_topic(
                        topic, PARTITIONS, replication_factor=1 if side == "unreplicated" else None
                    )
                os.sync()  # no dirty pages of the last round written back during this one
                sides[side] = _produce(work, bootstrap, brokers, topic, args.megabytes * MB)
                delete_topic(bootstrap, topic, data_dir)  # its page cache is warm for the next
            rounds.append(_ratios(sides["cluster"], sides["unreplicated"], sides["single"]))
            print(json.dumps({"round": number, **rounds[-1]}), flush=True)
    ratios = [key for key, value in rounds[0].items() if not isinstance(value, dict)]
    medians = {key: statistics.median(r[key] for r in rounds) for key in ratios}
    print(json.dumps({"medians": medians}))
    path = BENCHMARKS_DIR / "results" / f"replication-floor-{started:%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps({"megabytes": args.megabytes, "rounds": rounds, "medians": medians}, indent=1))
    print(f"results: {path}")
    return 0


def _produce(
    work: Path, bootstrap: str, brokers: list[BrokerProcess], topic: str, total: int
) -> dict[str, float]:
    """The scenario's produce load (1 KB records, acks=all, idempotent, linger.ms=5) with every
    broker under `perf record`: CPU per acknowledged MB, its system part and its libpython part."""
    data = [work / f"perf-{broker.pid}.data" for broker in brokers]
    recorders = [
        subprocess.Popen(
            ["perf", "record", "-q", "-F", "499", "-o", str(path), "-p", str(broker.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for broker, path in zip(brokers, data, strict=True)
    ]
    before = [broker.cpu_times() for broker in brokers]
    figures = run_client(
        "produce",
        {
            "bootstrap": bootstrap,
            "topic": topic,
            "partitions": PARTITIONS,
            "record_size": 1000,
            "records": total // 1000,
            "linger_ms": 5,
            "commit_interval_ms": 0,
            "abort_every": 0,
            "client_config": "{}",
        },
        600,
        work,
    )
    after = [broker.cpu_times() for broker in brokers]
    for recorder in recorders:
        recorder.send_signal(signal.SIGINT)
        recorder.wait()
    megabytes = figures["bytes"] / MB
    cpu = [sum(now) - sum(then) for now, then in zip(after, before, strict=True)]
    system = [now[1] - then[1] for now, then in zip(after, before, strict=True)]
    python = [spent * _python_share(path) for spent, path in zip(cpu, data, strict=True)]
    for path in data:
        path.unlink()
    return {
        "cpu_ms_per_mb": sum(cpu) * 1000 / megabytes,
        "system_ms_per_mb": sum(system) * 1000 / megabytes,
        "python_ms_per_mb": sum(python) * 1000 / megabytes,
    }


def _python_share(path: Path) -> float:
    """The share of a `perf record`'s samples in libpython (the interpreter and its builtins)."""
    report = subprocess.run(
        ["perf", "report", "-i", str(path), "--no-children", "--sort", "dso", "--stdio"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(
        float(match.group(1)) / 100
        for match in map(_DSO_LINE.match, report.splitlines())
        if match and "libpython" in match.group(2)
    )


def _ratios(
    cluster: dict[str, float], unreplicated: dict[str, float], single: dict[str, float]
) -> dict[str, Any]:
    one = single["cpu_ms_per_mb"]
    cpu, python = cluster["cpu_ms_per_mb"], cluster["python_ms_per_mb"]
    return {
        **{
            side: {key: round(value, 3) for key, value in figures.items()}
            for side, figures in (("cluster", cluster), ("unreplicated", unreplicated), ("single", single))
        },
        "ratio": round(cpu / one, 3),
        "unreplicated_ratio": round(unreplicated["cpu_ms_per_mb"] / one, 3),
        "kernel_only": round(cluster["system_ms_per_mb"] / one, 3),
        "replication_kernel_only": round(
            (unreplicated["cpu_ms_per_mb"] + cluster["system_ms_per_mb"] - unreplicated["system_ms_per_mb"])
            / one,
            3,
        ),
        "without_replication_python": round((cpu - (python - unreplicated["python_ms_per_mb"])) / one, 3),
        "without_extra_python": round((cpu - (python - single["python_ms_per_mb"])) / one, 3),
    }


if __name__ == "__main__":
    raise SystemExit(main())
