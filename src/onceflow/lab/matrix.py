"""`onceflow lab matrix`: each documented failure on its own against each guarantee, judged against
what the documents predict.

A cell is one small lab run (`runner.run_scenario`). For each anomaly it shows the count, or "not
tested" when the run never created the anomaly's preconditions (`coverage`), next to the
prediction (`promises.py`): at-most-once may lose and never duplicates, at-least-once never loses
and may duplicate, the idempotent producer never duplicates within one producer session (B, D and
E end it or reprocess input: may), exactly-once neither loses, duplicates nor reads aborted data.
A measurement that breaks a "never" is a disagreement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from onceflow.lab import coverage
from onceflow.lab.presets import PRESETS
from onceflow.lab.promises import ANOMALIES, MAY, NEVER, predict, why_may
from onceflow.lab.runner import Log, RunResult, Scenario, run_scenarios


@dataclass(frozen=True)
class Failure:
    key: str
    title: str
    faults: tuple[str, ...]


FAILURES = (
    Failure("A", "an ack lost after the broker stored the batch", ("lost-acks",)),
    Failure("B", "a producer crashed mid-batch, restarted, sends it again", ("producer-crash",)),
    Failure("C", "fire-and-forget sends lost on the way (a dropped request)", ("lost-requests",)),
    Failure("D", "a consumer crashed after processing, before committing", ("consumer-crash",)),
    Failure("E", "a zombie consumer: paused there, on again once its successor ran", ("zombie-consumer",)),
    Failure("F", "a hanging transaction: the broker's timeout aborts it", ("txn-timeout",)),
)
MESSAGES = 150
PRODUCE_S = 3.0


# Failures that need a consume-process-produce stage: a preset without one (the idempotent
# producer's) has no cell there.
NEEDS_READERS = frozenset({"consumer-crash", "zombie-consumer", "txn-timeout"})


def applies(failure: Failure, guarantee: str) -> bool:
    return PRESETS[guarantee].consumes or not NEEDS_READERS & set(failure.faults)


def judge(failure: Failure, result: RunResult) -> dict[str, Any]:
    """One cell: per anomaly the prediction, the count (None: not tested) and whether they agree
    (None: not tested, or nothing to disagree with); and the cell's overall agreement."""
    run = result.to_json()
    cells: dict[str, dict[str, Any]] = {}
    for anomaly, predicted in predict(result.scenario.guarantee, failure.faults).items():
        verdict = result.verdicts.get(anomaly, coverage.NOT_TESTED)
        measured = None if verdict == coverage.NOT_TESTED else int(run[anomaly])
        agrees = None if measured is None else (predicted == MAY or measured == 0)
        cells[anomaly] = {"predicted": predicted, "measured": measured, "verdict": verdict, "agrees": agrees}
    judged = [cell["agrees"] for cell in cells.values() if cell["predicted"] == NEVER]
    return {
        "failure": failure.key,
        "title": failure.title,
        "guarantee": result.scenario.guarantee,
        "faults": list(failure.faults),
        "cells": cells,
        "why_may": why_may(result.scenario.guarantee, failure.faults),
        # False on any broken promise; None when no promise could be checked at all.
        "agrees": False if False in judged else True if True in judged else None,
        "run": run,
    }


def run_cells(
    cells: Iterable[tuple[Failure, str]],
    workdir: Path,
    seed: int,
    bootstrap: str | None = None,
    messages: int = MESSAGES,
    produce_s: float = PRODUCE_S,
    log: Log = lambda _line: None,
) -> list[dict[str, Any]]:
    """One judged run per (failure, guarantee) cell, side by side (`runner.run_scenarios`); the rows
    in the order given."""
    cells = list(cells)
    runs = [
        (
            Scenario(guarantee, failure.faults, messages, seed, bootstrap, produce_s=produce_s),
            workdir / f"{failure.key}-{guarantee}",
        )
        for failure, guarantee in cells
    ]
    results = run_scenarios(runs, log)
    return [judge(failure, result) for (failure, _guarantee), result in zip(cells, results, strict=True)]


def problems(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The cells that break a promise or could not test one, as sentences."""
    found = []
    for row in rows:
        cell = f"{row['failure']} / {row['guarantee']}"
        if row["agrees"] is False:
            found.append(f"{cell}: the measurement breaks the promise")
        elif row["agrees"] is None:
            found.append(f"{cell}: not tested (the run never created the preconditions of a promise)")
    return found


def failure_of(key: str) -> Failure:
    [found] = [candidate for candidate in FAILURES if candidate.key == key]
    return found


def _cell_text(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return "[dim]-[/]"
    shown = "n/t" if cell["measured"] is None else str(cell["measured"])
    if cell["agrees"] is False:
        return f"[bold red]{shown} {cell['predicted']}![/]"
    if cell["measured"] is None:
        return f"[yellow]{shown}[/] {cell['predicted']}"
    return f"{shown} {cell['predicted']}"


def print_matrix(rows: Sequence[Mapping[str, Any]], console: Console | None = None) -> None:
    """Scenario x guarantee; each count beside its prediction ("never" or "may"), "n/t" when not
    tested, "!" where the measurement breaks the prediction. Fits 80 columns."""
    table = Table(title="delivery-semantics matrix", box=box.SIMPLE_HEAD, padding=(0, 1))
    table.add_column("failure", no_wrap=True)
    table.add_column("guarantee", no_wrap=True)
    table.add_column("lost", no_wrap=True)
    table.add_column("dup", no_wrap=True)
    table.add_column("aborted", no_wrap=True)
    table.add_column("agrees", no_wrap=True)
    previous = None
    for row in rows:
        agrees = row["agrees"]
        table.add_row(
            row["failure"] if row["failure"] != previous else "",
            row["guarantee"],
            *(_cell_text(row["cells"].get(anomaly)) for anomaly in ANOMALIES),
            "[green]yes[/]" if agrees else "[bold red]NO[/]" if agrees is False else "[yellow]not tested[/]",
        )
        previous = row["failure"]
    console = console or Console()
    console.print(table)
    for failure in FAILURES:
        if any(row["failure"] == failure.key for row in rows):
            console.print(f"  {failure.key}: {failure.title}", highlight=False)
    console.print("  n/t: not tested (the run never created the anomaly's preconditions)", highlight=False)
