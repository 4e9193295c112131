"""`onceflow lab run`, `onceflow lab matrix`, `onceflow lab broker-table` and `onceflow lab presets`."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from onceflow.admin.client import check_reachable
from onceflow.admin.errors import AdminError
from onceflow.arguments import output_directory, output_file, positive_float, positive_int
from onceflow.faults.proxy import BROKER_FAULTS
from onceflow.lab import controls, faults
from onceflow.lab.presets import PRESETS

REACH_TIMEOUT_S = 5.0


def progress_log() -> Callable[[str], None]:
    """Where the lab's progress lines go: stderr, each with the time and nothing else. On a
    terminal rich's log (it colours and wraps); piped, one plain line per message, unwrapped,
    so that a log file or grep gets whole lines."""
    if sys.stderr.isatty():
        from rich.console import Console

        return Console(stderr=True, log_path=False).log

    def log(message: str) -> None:
        print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)

    return log


def add_lab_arguments(lab: argparse.ArgumentParser) -> None:
    actions = lab.add_subparsers(dest="lab_command", required=True)
    run = actions.add_parser("run", help="run the workload under faults and check its history")
    run.add_argument(
        "--guarantee",
        action="append",
        choices=[*PRESETS, "all"],
        help="repeatable; default all",
    )
    run.add_argument(
        "--faults",
        action="append",
        metavar="F1,F2",
        help=f"a set of faults from {', '.join(faults.FAULTS)}; repeat for one run per set (default: all)",
    )
    run.add_argument("--messages", type=positive_int, default=300)
    run.add_argument(
        "--seconds",
        type=positive_float,
        default=6.0,
        help="how long the producers spread their messages over",
    )
    run.add_argument(
        "--broker-fault",
        choices=BROKER_FAULTS,
        help="make the lab's broker misbehave, to see the checker catch it (a negative control):"
        " each run says caught or MISSED",
    )
    run.add_argument("--seed", type=int, default=1)
    run.add_argument(
        "--bootstrap",
        help="judge this cluster (any Kafka-compatible one) instead of starting a broker:"
        " no broker-crash and no --broker-fault then",
    )
    run.add_argument("--json", type=output_file, help="write the runs as JSON here")
    run.add_argument(
        "--html",
        type=output_file,
        help="write a self-contained HTML report (timelines, charts, anomalies) here",
    )
    run.add_argument("--workdir", type=output_directory, help="keep histories, logs and broker data here")
    matrix = actions.add_parser(
        "matrix", help="each documented failure alone against each guarantee, judged against the promises"
    )
    matrix.add_argument(
        "--failure", action="append", choices=["A", "B", "C", "D", "E", "F"], help="repeatable; default all"
    )
    matrix.add_argument("--guarantee", action="append", choices=list(PRESETS), help="repeatable; default all")
    matrix.add_argument("--messages", type=positive_int, default=150)
    matrix.add_argument("--seconds", type=positive_float, default=3.0, help="how long the producers send for")
    matrix.add_argument("--seed", type=int, default=1)
    matrix.add_argument("--bootstrap", help="judge this cluster instead of starting a broker per run")
    matrix.add_argument("--json", type=output_file, help="write the matrix as JSON here")
    matrix.add_argument(
        "--html",
        type=output_file,
        help="write a self-contained HTML report: the matrix, then every cell's run",
    )
    matrix.add_argument("--workdir", type=output_directory, help="keep histories, logs and broker data here")
    broker_table = actions.add_parser(
        "broker-table",
        help="the documents' broker table on a cluster of its own (ZooKeeper and 3 brokers):"
        " acks=1 and acks=all under follower-lag and leader-crash, unclean-election",
    )
    broker_table.add_argument("--json", type=output_file, help="write the rows as JSON here")
    broker_table.add_argument(
        "--html", type=output_file, help="write a self-contained HTML page of the rows, each on a timeline"
    )
    broker_table.add_argument(
        "--workdir", type=output_directory, help="keep broker data, logs and histories here"
    )
    actions.add_parser("presets", help="print the client configs of the three guarantees")


def run_lab_command(args: argparse.Namespace) -> int:
    if args.lab_command == "presets":
        return _print_presets()
    if args.lab_command in ("run", "matrix") and (unreachable := bootstrap_error(args.bootstrap)):
        print(f"onceflow lab {args.lab_command}: {unreachable}", file=sys.stderr)
        return unreachable.exit_code
    if args.lab_command == "matrix":
        return _run_matrix(args)
    if args.lab_command == "broker-table":
        return _run_broker_table(args)
    guarantees = args.guarantee or ["all"]
    guarantees = list(PRESETS) if "all" in guarantees else list(dict.fromkeys(guarantees))
    fault_sets = [
        tuple(name.strip() for name in text.split(",") if name.strip())
        for text in args.faults or [",".join(faults.FAULTS)]
    ]
    unknown = {name for fault_set in fault_sets for name in fault_set} - set(faults.FAULTS)
    if unknown:
        print(f"onceflow: unknown fault(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if args.bootstrap and args.broker_fault:
        print("onceflow: --broker-fault needs the lab's own broker (drop --bootstrap)", file=sys.stderr)
        return 2
    if args.bootstrap and any(faults.OWN_BROKER_FAULTS & set(fault_set) for fault_set in fault_sets):
        print("onceflow: broker-crash needs the lab's own broker (drop --bootstrap)", file=sys.stderr)
        return 2
    # Imported here: building the parser for every onceflow command should stay cheap.
    from onceflow.lab import broker_metrics, report
    from onceflow.lab.runner import run_lab

    with tempfile.TemporaryDirectory(prefix="onceflow-lab-") as scratch:
        workdir = args.workdir or Path(scratch)
        results = run_lab(
            guarantees,
            fault_sets,
            args.messages,
            args.seed,
            workdir,
            args.bootstrap,
            log=progress_log(),
            broker_fault=args.broker_fault,
            produce_s=args.seconds,
        )
    runs = [result.to_json() for result in results]
    report.print_table(runs)
    for line in broker_metrics.summaries(runs):
        print(line)
    for number, run in enumerate(runs, 1):
        if run["control"] is not None:
            print(f"#{number} {run['guarantee']}: {controls.line(run['control'])}")
    if args.json:
        report.write_json(runs, args.json)
    if args.html:
        report.write_html(runs, args.html)
    found = report.problems(runs)
    for problem in found:
        print(f"onceflow: {problem}", file=sys.stderr)
    return 1 if found else 0


def bootstrap_error(bootstrap: str | None) -> AdminError | None:
    """Why a cluster given with --bootstrap cannot be judged (no broker answers), or None: its
    clients would otherwise retry for the whole run."""
    if bootstrap is None:
        return None
    try:
        check_reachable(bootstrap, REACH_TIMEOUT_S)
    except AdminError as error:
        return error
    return None


def _run_matrix(args: argparse.Namespace) -> int:
    from onceflow.lab import matrix, report

    chosen = set(args.failure or [failure.key for failure in matrix.FAILURES])
    failures = [failure for failure in matrix.FAILURES if failure.key in chosen]
    guarantees = list(dict.fromkeys(args.guarantee or PRESETS))
    cells = [(f, g) for f in failures for g in guarantees if matrix.applies(f, g)]
    with tempfile.TemporaryDirectory(prefix="onceflow-matrix-") as scratch:
        rows = matrix.run_cells(
            cells,
            args.workdir or Path(scratch),
            args.seed,
            args.bootstrap,
            args.messages,
            args.seconds,
            log=progress_log(),
        )
    matrix.print_matrix(rows)
    if args.json:
        args.json.write_text(json.dumps({"matrix": rows}, indent=2) + "\n", encoding="utf-8")
    if args.html:
        title = "onceflow delivery-semantics matrix"
        report.write_html([row["run"] for row in rows], args.html, title, matrix=rows)
    broken = [row for row in rows if row["agrees"] is False]
    for problem in matrix.problems(broken):
        print(f"onceflow: {problem}", file=sys.stderr)
    return 1 if broken else 0


def _run_broker_table(args: argparse.Namespace) -> int:
    from onceflow.lab import broker_table, report

    with tempfile.TemporaryDirectory(prefix="onceflow-broker-table-") as scratch:
        rows = broker_table.run_broker_table(args.workdir or Path(scratch), log=progress_log())
    broker_table.print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"broker_table": rows}, indent=2) + "\n", encoding="utf-8")
    if args.html:
        report.write_html([], args.html, "onceflow broker table", broker_table=rows)
    found = broker_table.problems(rows)
    for problem in found:
        print(f"onceflow: {problem}", file=sys.stderr)
    return 1 if found else 0


def _print_presets() -> int:
    for preset in PRESETS.values():
        print(f"# {preset.name}: {preset.summary}")
        print(f"producer = {json.dumps(preset.producer)}")
        print(f"consumer = {json.dumps(preset.consumer)}")
        print(f"commit offsets: {preset.commit}")
        for note in preset.notes:
            print(f"  - {note}")
        print()
    return 0
