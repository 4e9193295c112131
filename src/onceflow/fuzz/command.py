"""`onceflow fuzz`: run a campaign and print what it found."""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from onceflow.arguments import output_directory, output_file, positive_float, positive_int
from onceflow.extras import require
from onceflow.fuzz.campaign import FuzzReport, run


def add_fuzz_arguments(fuzz: argparse.ArgumentParser) -> None:
    fuzz.add_argument(
        "--seconds", type=positive_float, default=60.0, help="how long to send mutated requests"
    )
    fuzz.add_argument("--seed", type=int, default=1)
    fuzz.add_argument("--connections", type=positive_int, default=24, help="connections sending at once")
    fuzz.add_argument("--json", type=output_file, help="write the report as JSON here")
    fuzz.add_argument(
        "--regressions",
        type=output_directory,
        help="save each frame that crashes the broker (or makes it fail) here",
    )
    fuzz.add_argument("--workdir", type=output_directory, help="keep the broker's data and log here")


def run_fuzz_command(args: argparse.Namespace) -> int:
    require("onceflow fuzz", "kafka-python and aiokafka", "fuzz", ("kafka", "aiokafka"))
    with tempfile.TemporaryDirectory(prefix="onceflow-fuzz-") as scratch:
        workdir = args.workdir or Path(scratch)
        report = run(args.seconds, args.seed, args.connections, workdir, args.regressions)
    if args.json:
        args.json.write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    print_report(report)
    return 0 if report.clean else 1


def print_report(report: FuzzReport) -> None:
    console = Console()
    table = Table(title=f"onceflow fuzz, seed {report.seed}, {report.seconds:.0f} s")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rate = report.requests_sent / report.seconds if report.seconds else 0.0
    rows = [
        ("corpus frames (API keys)", f"{report.corpus_frames} ({len(report.corpus_api_keys)})"),
        ("mutated requests sent", f"{report.requests_sent:,} ({rate:,.0f}/s)"),
        ("API keys fuzzed", str(len(report.requests_by_api_key))),
        ("answered", f"{report.responses:,}"),
        ("connections closed by the broker", f"{report.connections_closed_by_broker:,}"),
        ("connections given up (no answer in time)", f"{report.connections_timed_out:,}"),
        ("crashes", str(report.crashes)),
        ("internal errors", str(report.internal_errors)),
        ("slowest answer to another client", f"{report.slowest_probe_s:.2f} s"),
        ("... of it not waiting for a CPU", f"{report.slowest_probe_held_s:.2f} s"),
        ("broker memory growth", f"{report.rss_growth_mb} MiB"),
        ("sentinel data intact", _yes(report.sentinel_intact)),
        ("... after SIGKILL and restart", _yes(report.sentinel_intact_after_restart)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for finding in report.findings:
        where = finding.saved_as or "not saved"
        console.print(f"{finding.kind} (api {finding.api_key}): {finding.detail} -> {where}")


def _yes(value: bool) -> str:
    return "yes" if value else "NO"
