"""Benchmark onceflow against its references, side by side in one run (`make bench`).

    .venv/bin/python benchmarks/run.py [--quick] [--only SCENARIO ...]

SCENARIO: throughput, latency, restart, transactions, isolation, spark, bounds, replication.

Prints a table of onceflow figures, reference figures and their ratios, and writes every raw
figure to benchmarks/results/<UTC timestamp>.json and merges it into benchmarks/results/latest.json,
which holds the latest figures of every scenario and names the file each came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import sys
import tempfile
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import confluent_kafka
from processes import BENCHMARKS_DIR, BenchmarkError
from rich.console import Console
from rich.table import Table
from scenarios import FULL, QUICK, SCENARIOS, TARGETS, Row, Run

RESULTS_DIR = BENCHMARKS_DIR / "results"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test (under a minute)")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="run only these scenarios")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the brokers and temporary files are cleaned up either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    selected = args.only or list(SCENARIOS)
    sizes = QUICK if args.quick else FULL
    # Rich falls back to 80 columns when piped, which wraps the table; logs can afford more.
    console = Console() if sys.stdout.isatty() else Console(width=140)
    started = datetime.now(UTC)
    machine = machine_info()
    figures: dict[str, Any] = {}
    rows: list[tuple[str, Row]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as work_dir:
            run = Run(Path(work_dir), sizes, console)
            for name in selected:
                console.print(f"[bold]{name}[/bold]")
                outcome = SCENARIOS[name](run)
                figures[name] = outcome.figures
                rows += [(name, row) for row in outcome.rows]
    except BenchmarkError as error:
        console.print(f"[red]benchmark failed:[/red] {error}")
        return 1
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]")
        return 130
    finished = datetime.now(UTC)
    console.print(results_table([row for _, row in rows]))
    report = {
        "started_at": started.isoformat(),
        "finished_at": finished.isoformat(),
        "seconds": (finished - started).total_seconds(),
        "quick": args.quick,
        "scenarios": selected,
        "machine": machine,
        "load_average_after": os.getloadavg(),
        "sizes": dataclasses.asdict(sizes),
        "targets": {text: dataclasses.asdict(target) for text, target in TARGETS.items()},
        "rows": [{**row.as_json(), "from_scenario": name} for name, row in rows],
        "figures": figures,
    }
    path = write_report(report, started)
    console.print(f"results: {path} ({report['seconds']:.0f} s)")
    return 0


def results_table(rows: list[Row]) -> Table:
    table = Table(
        title="onceflow benchmarks (ratio = onceflow / reference, both measured in this run;"
        " with rounds, the median of the rounds' ratios and their range)"
    )
    for column in ("scenario", "onceflow", "reference", "ratio", "target", "result"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for row in rows:
        result = {None: "", True: "[green]pass[/green]", False: "[red]miss[/red]"}[row.passed]
        reference = (
            f"{row.reference_name} skipped: {row.skipped}"
            if row.reference is None
            else f"{row.reference_name} {row.reference:,.2f} {row.unit}"
        )
        table.add_row(
            row.scenario,
            f"{row.onceflow:,.2f} {row.unit}",
            reference,
            ratio_text(row),
            row.target.text if row.target else "",
            result,
        )
    return table


def ratio_text(row: Row) -> str:
    """The ratio, and with rounds the lowest and highest of theirs: `1.23 (1.10-1.31)`."""
    if row.ratio is None:
        return ""
    spread = row.spread
    return f"{row.ratio:.2f}" + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else "")


def machine_info() -> dict[str, Any]:
    cpu_model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.partition(":")[2].strip()
            break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "load_average_before": os.getloadavg(),
        "platform": platform.platform(),
        "python": sys.version,
        "confluent_kafka": metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "onceflow": metadata.version("onceflow"),
        "temp_dir": tempfile.gettempdir(),
    }


def write_report(report: dict[str, Any], started: datetime) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    latest_path = RESULTS_DIR / "latest.json"
    previous = json.loads(latest_path.read_text()) if latest_path.exists() else None
    latest_path.write_text(json.dumps(merge_latest(previous, report, path.name), indent=2) + "\n")
    return path


def merge_latest(latest: dict[str, Any] | None, report: dict[str, Any], file_name: str) -> dict[str, Any]:
    """The previous latest.json with this run's scenarios replaced, so `--only` keeps the others.

    The run-wide fields (times, machine, sizes) are this run's; `results_files` names the run
    each scenario's figures come from, whose file has that run's machine and load average.
    """
    files = {name: file_name for name in report["scenarios"]}
    # Quick figures only show that things run: they never sit next to full ones.
    if latest is None or latest["quick"] != report["quick"]:
        return {**report, "results_files": files}
    selected = set(report["scenarios"])
    kept_rows = [row for row in latest["rows"] if row["from_scenario"] not in selected]
    return {
        **report,
        "scenarios": [name for name in SCENARIOS if name in selected or name in latest["scenarios"]],
        "results_files": {**latest["results_files"], **files},
        "rows": kept_rows + report["rows"],
        "figures": {**latest["figures"], **report["figures"]},
    }


if __name__ == "__main__":
    sys.exit(main())
