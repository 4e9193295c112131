"""The demo's short matrix: its cells are cells of the matrix, and its verdict fails the demo on a
broken promise and on a cell that tested none; a stage that fails is one line, not a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from onceflow.demo import SHORT_MATRIX, Failures, matrix_verdict
from onceflow.lab import matrix, promises


def _row(key: str, guarantee: str, agrees: bool | None) -> dict[str, Any]:
    return {"failure": key, "guarantee": guarantee, "agrees": agrees}


def _verdict(rows: list[dict[str, Any]]) -> tuple[int, str]:
    console = Console(width=80, record=True, color_system=None)
    return matrix_verdict(rows, console), console.export_text()


def test_the_short_matrix_names_cells_of_the_matrix() -> None:
    assert len(SHORT_MATRIX) == len(set(SHORT_MATRIX)) <= 6  # about a minute on two cores
    for key, guarantee in SHORT_MATRIX:
        assert matrix.applies(matrix.failure_of(key), guarantee)
        assert guarantee in promises.PREDICTIONS
    # The documents' formula and its limit: the idempotent producer within one session and across
    # a restart, against transactions across a restart.
    assert {("A", "idempotent"), ("B", "idempotent"), ("B", "exactly-once")} <= set(SHORT_MATRIX)


def test_cells_that_keep_their_promises_pass() -> None:
    assert _verdict([_row(key, guarantee, True) for key, guarantee in SHORT_MATRIX]) == (0, "")


def test_a_broken_promise_fails_the_demo() -> None:
    code, text = _verdict([_row("A", "exactly-once", True), _row("D", "exactly-once", False)])
    assert code == 1
    assert "matrix D / exactly-once: the measurement breaks the promise" in text


def test_a_cell_that_tested_no_promise_fails_the_demo() -> None:
    code, text = _verdict([_row("E", "exactly-once", None)])
    assert code == 1
    assert "matrix E / exactly-once: not tested" in text


def test_a_failed_stage_is_one_line_and_its_traceback_a_file(tmp_path: Path) -> None:
    failures = Failures(tmp_path)

    def waits_in_vain() -> int:
        raise TimeoutError("waited 60 s for a new leader of acks-1")

    assert failures.guard("the broker table", waits_in_vain) is None
    assert failures.guard("the lab", lambda: 7) == 7
    [line] = failures.lines
    assert line.startswith("the broker table failed: TimeoutError: waited 60 s for a new leader of acks-1")
    assert "Traceback" in (tmp_path / "error-1.txt").read_text()
