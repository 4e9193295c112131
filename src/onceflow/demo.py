"""The main job: the three delivery guarantees side by side, under the same seeded faults.

Four stages, each checked record by record, all running side by side:
1. The lab (`onceflow.lab`): producers behind a proxy that loses acks and SIGKILLs them,
   consume-process-produce workers SIGKILLed before they commit, per guarantee preset.
2. A short matrix (`onceflow.lab.matrix`): a few documented failures, each alone, against the
   guarantees whose promises they put to the test, each cell judged against its prediction.
3. The Spark payments pipeline (`onceflow.pipeline`), exactly-once and at-least-once: the driver is
   SIGKILLed once, at the worst moment (a micro-batch written but not yet in the checkpoint), and
   restarted from its checkpoint. Spark has no at-most-once sink, so that guarantee is the lab's alone.
4. The broker table (`onceflow.lab.broker_table`), on ZooKeeper and 3 brokers of its own (not with
   `--bootstrap`): acks=1 loses under a leader crash with lagging followers, acks=all with
   min.insync.replicas=2 does not, an unclean election truncates.

The demo passes only if exactly-once shows no loss, no duplicate and no aborted read, each of them
tested (its lab run created the anomaly's preconditions, see `onceflow.lab.coverage`), every cell
of the short matrix keeps its promises and tested at least one, and the database balances equal
the exact sums of the committed payments, and every row of the broker table agrees with the
documents' prediction and tested it.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from onceflow.embedded import EmbeddedBroker
from onceflow.extras import require
from onceflow.lab import broker_metrics, broker_table, matrix
from onceflow.lab.command import bootstrap_error
from onceflow.lab.presets import PRESETS
from onceflow.lab.report import NOT_TESTED, label, print_table, write_html, write_json
from onceflow.lab.runner import Scenario, run_scenario
from onceflow.pipeline.driver import driver_env
from onceflow.pipeline.events import Workload, generate
from onceflow.pipeline.process import Outputs, PipelineProcess, read_balances, read_outputs
from onceflow.pipeline.settings import AT_LEAST_ONCE, EXACTLY_ONCE, PipelineSettings

LAB_FAULTS = ("lost-acks", "producer-crash", "consumer-crash")
PIPELINE_FAULTS = ("spark-driver-kill",)
# The short matrix, under a minute on two cores: cells whose failure creates the preconditions of a
# promise on every run, whatever the timing. Lost acks against exactly-once; a consumer killed
# before its commit against at-least-once (never loses) and exactly-once; a zombie against
# at-most-once (never duplicates) and exactly-once. (At-most-once commits first, so its killed
# consumers test only losses, which it may have: its consumer-crash cell would often test nothing.)
SHORT_MATRIX = (
    ("A", "exactly-once"),
    ("D", "at-least-once"),
    ("D", "exactly-once"),
    ("E", "at-most-once"),
    ("E", "exactly-once"),
)
PIPELINE_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class DemoSize:
    lab_messages: int
    payments: int
    max_offsets: int


FULL = DemoSize(lab_messages=300, payments=800, max_offsets=200)
SHORT = DemoSize(lab_messages=200, payments=400, max_offsets=150)


def run_demo(
    report_dir: Path, seed: int, short: bool, bootstrap: str | None, console: Console | None = None
) -> int:
    # Before the lab's minutes: the pipeline stage runs Spark in a subprocess.
    require("onceflow demo", "PySpark", "lab", ("pyspark", "pandas", "pyarrow"))
    if unreachable := bootstrap_error(bootstrap):
        print(f"onceflow demo: {unreachable}", file=sys.stderr)
        return unreachable.exit_code
    # Wide enough for the side-by-side table also when the output goes to a file or a CI log.
    console = console or Console(width=None if Console().is_terminal else 150)
    size = SHORT if short else FULL
    report_dir.mkdir(parents=True, exist_ok=True)
    # Histories, logs and broker data stay next to the reports, to look things up in.
    workdir = report_dir / "work"
    shutil.rmtree(workdir, ignore_errors=True)
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    guarantees = (EXACTLY_ONCE,) if bootstrap else (EXACTLY_ONCE, AT_LEAST_ONCE)
    with (
        Progress(
            TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console
        ) as progress,
        ThreadPoolExecutor(max_workers=5) as pool,
    ):
        # The Spark stages mostly wait on their JVMs, the lab and the matrix on their timed
        # faults, the broker table on ZooKeeper sessions to end: side by side, each with brokers
        # (or topics, with --bootstrap) of its own, they take about as long as the longest alone.
        pipelines = [
            pool.submit(_pipeline_stage, progress, guarantee, size, seed, bootstrap, workdir / guarantee)
            for guarantee in guarantees
        ]
        lab = pool.submit(_lab_stage, progress, size, seed, bootstrap, workdir)
        cells = pool.submit(_matrix_stage, progress, seed, bootstrap, workdir / "matrix")
        # Its own cluster: not with --bootstrap.
        brokers = None if bootstrap else pool.submit(_broker_table_stage, progress, workdir / "broker-table")
        rows = cells.result()
        runs += lab.result() + [pipeline.result() for pipeline in pipelines]
        table = [] if brokers is None else brokers.result()
    print_table(runs, console, title="onceflow demo: delivery guarantees under the same faults")
    for line in broker_metrics.summaries(runs):
        console.print(line, highlight=False)
    matrix.print_matrix(rows, console)
    reports = ["report.json", "matrix.json", "report.html"]
    if brokers is not None:
        broker_table.print_table(table, console)
        (report_dir / "broker-table.json").write_text(
            json.dumps({"broker_table": table}, indent=2) + "\n", encoding="utf-8"
        )
        reports.append("broker-table.json")
    write_json(runs, report_dir / "report.json")
    (report_dir / "matrix.json").write_text(json.dumps({"matrix": rows}, indent=2) + "\n", encoding="utf-8")
    title = "onceflow demo: delivery guarantees under faults"
    write_html([*runs, *(row["run"] for row in rows)], report_dir / "report.html", title, matrix=rows)
    console.print(f"reports: {', '.join(str(report_dir / name) for name in reports)}")
    console.print(f"finished in {time.monotonic() - started:.0f} s")
    return max(_verdict(runs, console), matrix_verdict(rows, console), broker_table_verdict(table, console))


def run_short_matrix(
    workdir: Path, seed: int, bootstrap: str | None, cells: Sequence[tuple[str, str]] = SHORT_MATRIX
) -> list[dict[str, Any]]:
    """Cells of the matrix (failure key, guarantee), one small lab run each, judged."""
    chosen = [(matrix.failure_of(key), guarantee) for key, guarantee in cells]
    return matrix.run_cells(chosen, workdir, seed, bootstrap)


def matrix_verdict(rows: Sequence[Mapping[str, Any]], console: Console) -> int:
    """1 when a cell breaks its promise or tested none of them."""
    found = matrix.problems(rows)
    for problem in found:
        console.print(f"[bold red]matrix {problem}[/]")
    return 1 if found else 0


def broker_table_verdict(rows: Sequence[Mapping[str, Any]], console: Console) -> int:
    """1 when a row of the broker table disagrees with the documents or tested nothing."""
    found = broker_table.problems(rows)
    for problem in found:
        console.print(f"[bold red]{problem}[/]")
    return 1 if found else 0


def _broker_table_stage(progress: Progress, workdir: Path) -> list[dict[str, Any]]:
    task = progress.add_task("broker table: starting ZooKeeper and 3 brokers", total=None)

    def log(line: str) -> None:
        progress.update(task, description=line)

    rows = broker_table.run_broker_table(workdir, log=log)
    progress.update(task, description="broker table: done", total=1, completed=1)
    return rows


def _matrix_stage(
    progress: Progress, seed: int, bootstrap: str | None, workdir: Path
) -> list[dict[str, Any]]:
    task = progress.add_task("matrix", total=len(SHORT_MATRIX))
    rows = []
    for key, guarantee in SHORT_MATRIX:
        progress.update(task, description=f"matrix: failure {key} against {guarantee}")
        rows += run_short_matrix(workdir, seed, bootstrap, [(key, guarantee)])
        progress.advance(task)
    return rows


def _lab_stage(
    progress: Progress, size: DemoSize, seed: int, bootstrap: str | None, workdir: Path
) -> list[dict[str, Any]]:
    faults = LAB_FAULTS  # none kills a broker, so they reach an external cluster too
    task = progress.add_task("lab: three guarantees", total=len(PRESETS))
    runs = []
    for guarantee in PRESETS:
        progress.update(task, description=f"lab: {guarantee} under {', '.join(faults)}")
        run_dir = workdir / f"lab-{guarantee}"
        run_dir.mkdir(parents=True)
        result = run_scenario(Scenario(guarantee, faults, size.lab_messages, seed, bootstrap), run_dir)
        runs.append({"stage": "lab", **result.to_json()})
        progress.advance(task)
    return runs


def _pipeline_stage(
    progress: Progress, guarantee: str, size: DemoSize, seed: int, bootstrap: str | None, workdir: Path
) -> dict[str, Any]:
    workdir.mkdir(parents=True)
    task = progress.add_task(f"spark pipeline, {guarantee}: starting", total=3)
    broker = None if bootstrap else EmbeddedBroker(workdir / "broker", metrics_port=0).start()
    address = bootstrap or broker.bootstrap_servers  # type: ignore[union-attr]
    try:
        workload = generate(address, count=size.payments, seed=seed)
        settings = PipelineSettings(
            address,
            workdir / "checkpoint",
            str(workdir / "balances.db"),
            guarantee=guarantee,
            max_offsets=size.max_offsets,
            until_idle_s=2,
        )
        log_path = workdir / "pipeline.log"
        progress.update(task, description=f"spark pipeline, {guarantee}: running until the driver is killed")
        # The driver kills itself (SIGKILL to its whole session) when the first micro-batch is written.
        killing = {**driver_env(), "ONCEFLOW_FAILPOINTS": "spark.sink.commit"}
        first = PipelineProcess(settings, log_path, killing)
        first.start().wait(PIPELINE_TIMEOUT_S)
        progress.advance(task)
        progress.update(task, description=f"spark pipeline, {guarantee}: restarted from its checkpoint")
        exit_code = PipelineProcess(settings, log_path, driver_env()).start().wait(PIPELINE_TIMEOUT_S)
        if exit_code != 0:
            raise RuntimeError(f"the pipeline failed (exit {exit_code}); see {log_path}")
        progress.advance(task)
        progress.update(task, description=f"spark pipeline, {guarantee}: checking outputs and balances")
        outputs = read_outputs(address)
        balances = read_balances(settings.db)
        metrics = None if broker is None else broker_metrics.scrape(broker.metrics_url).to_json()
        progress.advance(task)
    finally:
        if broker is not None:
            broker.stop()
    return {**_pipeline_run(guarantee, seed, workload, outputs, balances), "broker_metrics": metrics}


def _pipeline_run(
    guarantee: str, seed: int, workload: Workload, outputs: Outputs, balances: dict[str, int]
) -> dict[str, Any]:
    """The run in the lab's report shape: a booking is both its order-status and seat records."""
    topics = {"order-status": outputs.order_status, "seat-reservations": outputs.seat_reservations}
    lost = sorted(p for p in workload.expected_payments() if not all(seen[p] for seen in topics.values()))
    aborted = sorted(set(outputs.order_status | outputs.seat_reservations) & workload.aborted_payments())
    missing = "committed payment missing from an output topic"
    anomalies = [_anomaly("lost-write", [payment], missing) for payment in lost]
    duplicated = 0
    for topic, seen in topics.items():
        for payment, copies in sorted(seen.items()):
            if copies > 1:
                duplicated += copies - 1
                anomalies.append(_anomaly("duplicate", [payment], f"{copies} copies on {topic}"))
    anomalies += [
        _anomaly("aborted-read", [payment], "payment of an aborted transaction") for payment in aborted
    ]
    expected_balances = workload.expected_balances()
    wrong = {
        account: {"expected": expected_balances.get(account, 0), "actual": balances.get(account, 0)}
        for account in set(expected_balances) | set(balances)
        if expected_balances.get(account, 0) != balances.get(account, 0)
    }
    anomalies += [
        _anomaly("wrong-balance", [account], f"expected {cents['expected']} cents, found {cents['actual']}")
        for account, cents in sorted(wrong.items())
    ]
    return {
        "stage": "spark pipeline",
        "guarantee": guarantee,
        "faults": list(PIPELINE_FAULTS),
        "seed": seed,
        "produced": len(workload.committed()),
        "acknowledged": len(workload.committed()),
        "delivered": sum(outputs.order_status.values()),
        "lost": len(lost),
        "duplicated": duplicated,
        "aborted_reads": len(aborted),
        "balances_match": not wrong,
        "anomalies": anomalies,
    }


def _anomaly(kind: str, values: list[str], detail: str) -> dict[str, Any]:
    """In the checker's shape; the pipeline's anomalies name payments and accounts, not offsets."""
    return {"kind": kind, "values": values, "offsets": [], "detail": detail}


def _verdict(runs: list[dict[str, Any]], console: Console) -> int:
    exactly_once = [run for run in runs if run["guarantee"] == EXACTLY_ONCE]
    # A 0 proves nothing when the run never created the anomaly's preconditions.
    untested = {
        label(run): [anomaly for anomaly, verdict in run.get("verdicts", {}).items() if verdict == NOT_TESTED]
        for run in runs
    }
    for name, anomalies in untested.items():
        if anomalies:
            console.print(f"[yellow]{name}: {', '.join(anomalies)} not tested: no preconditions created[/]")
    failed = [
        run
        for run in exactly_once
        if run["lost"]
        or run["duplicated"]
        or run["aborted_reads"]
        or not run.get("balances_match", True)
        or untested[label(run)]
    ]
    for guarantee, key, shows in (
        ("at-least-once", "duplicated", "duplicates"),
        ("at-most-once", "lost", "losses"),
    ):
        if not any(run[key] for run in runs if run["guarantee"] == guarantee):
            console.print(
                f"[yellow]{guarantee} shows no {shows}: faults too mild to show the difference in this run[/]"
            )
    if failed:
        console.print(
            f"[bold red]exactly-once broke or went untested in {len(failed)} run(s): see the report[/]"
        )
        return 1
    console.print(
        "[bold green]exactly-once: 0 lost, 0 duplicated, 0 aborted reads; balances match the exact sums[/]"
    )
    return 0
