"""The main job: the delivery guarantees side by side, under the same seeded faults.

Four stages, each checked record by record, all running side by side:
1. The lab (`onceflow.lab`): producers behind a proxy that loses acks and SIGKILLs them,
   consume-process-produce workers SIGKILLed before they commit, per guarantee preset (the
   documents' three, and the idempotent producer of their formula).
2. A short matrix (`onceflow.lab.matrix`): a few documented failures, each alone, against the
   guarantees whose promises they put to the test, each cell judged against its prediction: the
   idempotent producer under lost acks (no duplicates) and restarted (duplicates again), against
   exactly-once restarted (none).
3. The Spark payments pipeline (`onceflow.pipeline`), exactly-once and at-least-once: the driver is
   SIGKILLed once, at the worst moment (a micro-batch written but not yet in the checkpoint), and
   restarted from its checkpoint. Spark has no at-most-once sink, so that guarantee is the lab's alone.
4. The broker table (`onceflow.lab.broker_table`), on ZooKeeper and 3 brokers of its own (not with
   `--bootstrap`): acks=1 loses under a leader crash with lagging followers, acks=all with
   min.insync.replicas=2 does not, an unclean election truncates.

The demo passes only if exactly-once shows no loss, no duplicate and no aborted read, each of them
tested (its lab run created the anomaly's preconditions, see `onceflow.lab.coverage`), no run
breaks a promise of its guarantee, every cell of the short matrix keeps its promises and tested at
least one, the database balances equal the exact sums of the committed payments, every row of the
broker table agrees with the documents' prediction and tested it, and every stage finished. A stage
that fails says so in one line (its traceback goes to a file beside the reports); the others
still report.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from onceflow.embedded import EmbeddedBroker
from onceflow.extras import require
from onceflow.lab import broker_metrics, broker_table, matrix, promises
from onceflow.lab.command import bootstrap_error
from onceflow.lab.presets import PRESETS
from onceflow.lab.report import NOT_TESTED, print_table, stage_label, write_html, write_json
from onceflow.lab.runner import Scenario, run_scenario
from onceflow.pipeline.driver import driver_env
from onceflow.pipeline.events import Workload, generate
from onceflow.pipeline.process import Outputs, PipelineProcess, read_balances, read_outputs
from onceflow.pipeline.settings import AT_LEAST_ONCE, EXACTLY_ONCE, PipelineSettings

LAB_FAULTS = ("lost-acks", "producer-crash", "consumer-crash")
PIPELINE_FAULTS = ("spark-driver-kill",)
# The short matrix, about a minute on two cores: cells whose failure creates the preconditions of a
# promise on every run, whatever the timing. The documents' formula: the idempotent producer under
# lost acks (never duplicates within its session) and restarted (a new session: may duplicate),
# and exactly-once restarted (never); a consumer killed before its commit against at-least-once
# (never loses); a zombie against at-most-once (never duplicates) and exactly-once. (The lab stage
# runs exactly-once under lost acks and consumer crashes too. At-most-once commits first, so its
# killed consumers test only losses, which it may have: its consumer-crash cell would often test
# nothing.)
SHORT_MATRIX = (
    ("A", "idempotent"),
    ("B", "idempotent"),
    ("B", "exactly-once"),
    ("D", "at-least-once"),
    ("E", "at-most-once"),
    ("E", "exactly-once"),
)
PIPELINE_TIMEOUT_S = 240.0


T = TypeVar("T")


@dataclass
class Failures:
    """The stages (or parts of them) that failed, each said in one line; their tracebacks go to
    files in the work directory."""

    workdir: Path
    lines: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def guard(self, what: str, action: Callable[[], T]) -> T | None:
        """`action()`, or None when it raised: then one line names `what` failed and why."""
        try:
            return action()
        except Exception as error:  # one stage's failure must not hide the others' results
            with self._lock:
                path = self.workdir / f"error-{len(self.lines) + 1}.txt"
                path.write_text(f"{what}\n{traceback.format_exc()}", encoding="utf-8")
                self.lines.append(f"{what} failed: {type(error).__name__}: {error} (traceback in {path})")
            return None

    def result(self, what: str, future: Future[T]) -> T | None:
        return self.guard(what, future.result)


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
    workdir.mkdir(parents=True)
    failures = Failures(workdir)
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
            (
                guarantee,
                pool.submit(_pipeline_stage, progress, guarantee, size, seed, bootstrap, workdir / guarantee),
            )
            for guarantee in guarantees
        ]
        lab = pool.submit(_lab_stage, progress, size, seed, bootstrap, workdir, failures)
        cells = pool.submit(_matrix_stage, progress, seed, bootstrap, workdir / "matrix", failures)
        # Its own cluster: not with --bootstrap.
        brokers = None if bootstrap else pool.submit(_broker_table_stage, progress, workdir / "broker-table")
        rows = failures.result("the short matrix", cells) or []
        lab_runs = failures.result("the lab", lab)
        runs += lab_runs or []
        for guarantee, pipeline in pipelines:
            run = failures.result(f"the Spark pipeline, {guarantee}", pipeline)
            runs += [run] if run is not None else []
        table = [] if brokers is None else failures.result("the broker table", brokers) or []
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
    matrix_runs = [row["run"] for row in rows]
    write_html(
        [*runs, *matrix_runs],
        report_dir / "report.html",
        title,
        matrix=rows,
        broker_table=table,
        notes=failures.lines,
    )
    console.print(f"reports: {', '.join(str(report_dir / name) for name in reports)}")
    console.print(f"finished in {time.monotonic() - started:.0f} s")
    for line in failures.lines:
        console.print(f"[bold red]{line}[/]", highlight=False)
    return max(
        _verdict(runs, guarantees, console),
        matrix_verdict(rows, console),
        broker_table_verdict(table, console),
        1 if failures.lines else 0,
    )


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
    progress: Progress, seed: int, bootstrap: str | None, workdir: Path, failures: Failures
) -> list[dict[str, Any]]:
    task = progress.add_task("matrix", total=len(SHORT_MATRIX))
    rows = []
    for key, guarantee in SHORT_MATRIX:
        progress.update(task, description=f"matrix: failure {key} against {guarantee}")
        cells = [(key, guarantee)]
        run_cell = functools.partial(run_short_matrix, workdir, seed, bootstrap, cells)
        rows += failures.guard(f"matrix cell {key} / {guarantee}", run_cell) or []
        progress.advance(task)
    return rows


def _lab_stage(
    progress: Progress, size: DemoSize, seed: int, bootstrap: str | None, workdir: Path, failures: Failures
) -> list[dict[str, Any]]:
    faults = LAB_FAULTS  # none kills a broker, so they reach an external cluster too
    task = progress.add_task(f"lab: {len(PRESETS)} guarantees", total=len(PRESETS))
    runs = []
    for guarantee in PRESETS:
        progress.update(task, description=f"lab: {guarantee} under {', '.join(faults)}")
        run_dir = workdir / f"lab-{guarantee}"
        run_dir.mkdir(parents=True)
        scenario = Scenario(guarantee, faults, size.lab_messages, seed, bootstrap)
        result = failures.guard(
            f"the lab run of {guarantee}", functools.partial(run_scenario, scenario, run_dir)
        )
        if result is not None:
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
    moments: dict[str, float] = {"start": time.time()}
    try:
        workload = generate(address, count=size.payments, seed=seed)
        moments["generated"] = time.time()
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
        moments["driver"] = time.time()
        first_exit = _run_driver(
            PipelineProcess(settings, log_path, killing), "the driver meant to be killed"
        )
        moments["killed"] = time.time()
        if first_exit != -signal.SIGKILL:
            raise RuntimeError(
                f"the driver was not killed at its failpoint (exit {first_exit}); see {log_path}"
            )
        progress.advance(task)
        progress.update(task, description=f"spark pipeline, {guarantee}: restarted from its checkpoint")
        moments["restarted"] = time.time()
        exit_code = _run_driver(PipelineProcess(settings, log_path, driver_env()), "the restarted driver")
        moments["finished"] = time.time()
        if exit_code != 0:
            raise RuntimeError(f"the pipeline failed (exit {exit_code}); see {log_path}")
        progress.advance(task)
        progress.update(task, description=f"spark pipeline, {guarantee}: checking outputs and balances")
        outputs = read_outputs(address)
        balances = read_balances(settings.db)
        moments["checked"] = time.time()
        metrics = None if broker is None else broker_metrics.scrape(broker.metrics_url).to_json()
        progress.advance(task)
    finally:
        if broker is not None:
            broker.stop()
    run = pipeline_run(guarantee, seed, workload, outputs, balances)
    return {**run, "timeline": pipeline_timeline(moments), "broker_metrics": metrics}


def _run_driver(pipeline: PipelineProcess, what: str) -> int:
    """The driver's exit code; past the deadline its whole session is killed and the stage fails."""
    pipeline.start()
    try:
        return pipeline.wait(PIPELINE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pipeline.kill()
        raise TimeoutError(f"{what} did not finish within {PIPELINE_TIMEOUT_S:g} s") from None


def pipeline_timeline(moments: Mapping[str, float]) -> dict[str, Any]:
    """A pipeline run as the report draws a lab run's (`lab.timeline.build`): the generator and
    the two drivers as lanes, a cross and a band where the first was SIGKILLed."""
    start = moments["start"]

    def at(name: str) -> float:
        return round(moments[name] - start, 3)

    def span(incarnation: int, begin: str, end: str, replaced: bool) -> dict[str, Any]:
        return {"incarnation": incarnation, "start": at(begin), "end": at(end), "replaced": replaced}

    lanes = [
        {"name": "payment generator", "spans": [span(0, "start", "generated", False)]},
        {
            "name": "spark driver",
            "spans": [span(0, "driver", "killed", True), span(1, "restarted", "finished", False)],
        },
        {"name": "checker", "spans": [span(0, "finished", "checked", False)]},
    ]
    killed = "driver SIGKILLed: a micro-batch written, not yet in the checkpoint"
    bands = [{"label": killed, "start": at("killed"), "end": at("restarted")}]
    return {
        "duration": max(at("checked"), 0.5),
        "bands": bands,
        "lanes": lanes,
        "bucket_s": 1.0,
        "buckets": [],
    }


def pipeline_run(
    guarantee: str, seed: int, workload: Workload, outputs: Outputs, balances: dict[str, int]
) -> dict[str, Any]:
    """The run in the lab's report shape, counted in payments: a booking is its order-status and
    seat records together, so a payment lost from either topic is lost once, and one copied on
    either (or both) is duplicated once."""
    topics = {"order-status": outputs.order_status, "seat-reservations": outputs.seat_reservations}
    expected = workload.expected_payments()
    lost = sorted(p for p in expected if not all(seen[p] for seen in topics.values()))
    aborted = sorted(set(outputs.order_status | outputs.seat_reservations) & workload.aborted_payments())
    missing = "committed payment missing from an output topic"
    anomalies = [_anomaly("lost-write", [payment], missing) for payment in lost]
    copied = sorted({payment for seen in topics.values() for payment, copies in seen.items() if copies > 1})
    for payment in copied:
        copies = ", ".join(
            f"{topics[topic][payment]} on {topic}" for topic in topics if topics[topic][payment]
        )
        anomalies.append(_anomaly("duplicate", [payment], f"copies: {copies}"))
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
    delivered = {p for p in outputs.order_status if outputs.seat_reservations[p]}
    return {
        "stage": "spark pipeline",
        "guarantee": guarantee,
        "faults": list(PIPELINE_FAULTS),
        "seed": seed,
        "unit": "payments",
        "produced": len(expected),
        "acknowledged": len(expected),
        "delivered": len(delivered),
        "lost": len(lost),
        "duplicated": len(copied),
        "aborted_reads": len(aborted),
        "balances_match": not wrong,
        "anomalies": anomalies,
    }


def _anomaly(kind: str, values: list[str], detail: str) -> dict[str, Any]:
    """In the checker's shape; the pipeline's anomalies name payments and accounts, not offsets."""
    return {"kind": kind, "values": values, "offsets": [], "detail": detail}


def _verdict(runs: list[dict[str, Any]], pipelines: Sequence[str], console: Console) -> int:
    exactly_once = [run for run in runs if run["guarantee"] == EXACTLY_ONCE]
    # A 0 proves nothing when the run never created the anomaly's preconditions.
    untested = {
        stage_label(run): [
            anomaly for anomaly, verdict in run.get("verdicts", {}).items() if verdict == NOT_TESTED
        ]
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
        or untested[stage_label(run)]
    ]
    broken = [(run, promise) for run in runs for promise in promises.broken(run)]
    for run, promise in broken:
        console.print(f"[bold red]{stage_label(run)}: broken promise: {promise}[/]", highlight=False)
    for guarantee, key, shows in (
        ("at-least-once", "duplicated", "duplicates"),
        ("at-most-once", "lost", "losses"),
    ):
        if not any(run[key] for run in runs if run["guarantee"] == guarantee):
            console.print(
                f"[yellow]{guarantee} shows no {shows}: faults too mild to show the difference in this run[/]"
            )
    # Each exactly-once run (the lab's, the pipeline's) must have reported: a failed one is no evidence.
    missing = 1 + list(pipelines).count(EXACTLY_ONCE) - len(exactly_once)
    if failed or broken or missing:
        console.print(
            f"[bold red]exactly-once broke or went untested in {len(failed)} run(s), {missing} missing,"
            f" {len(broken)} promise(s) broken: see the report[/]"
        )
        return 1
    console.print(
        "[bold green]exactly-once: 0 lost, 0 duplicated, 0 aborted reads; balances match the exact sums[/]"
    )
    return 0
