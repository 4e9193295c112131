"""`onceflow lab matrix` on a part of the matrix: every cell's measurement keeps its guarantee's
promise, and the promises were put to the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from onceflow.lab.matrix import ANOMALIES, MAY, NEVER

pytestmark = pytest.mark.soak


def _matrix(tmp_path: Path, *selection: str) -> tuple[dict[tuple[str, str], Any], str]:
    out = tmp_path / "matrix.json"
    completed = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "lab", "matrix", *selection, "--seed", "3", "--json", out],
        capture_output=True,
        text=True,
        timeout=140,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert max(len(line) for line in completed.stdout.splitlines()) <= 80, completed.stdout
    rows = {(row["failure"], row["guarantee"]): row for row in json.loads(out.read_text())["matrix"]}
    for (failure, guarantee), row in rows.items():
        assert row["agrees"] is not False, (failure, guarantee, row["cells"], row["run"]["anomalies"][:3])
        assert row["run"]["drained"], row["run"]["injected"]
        for anomaly, cell in row["cells"].items():
            assert anomaly in ANOMALIES and cell["predicted"] in (MAY, NEVER)
    return rows, completed.stdout


@pytest.mark.timeout(150)
def test_exactly_once_keeps_its_promises_under_lost_acks_and_a_zombie(tmp_path: Path) -> None:
    rows, table = _matrix(
        tmp_path, "--failure", "A", "--failure", "E", "--failure", "F", "--guarantee", "exactly-once"
    )
    assert set(rows) == {("A", "exactly-once"), ("E", "exactly-once"), ("F", "exactly-once")}
    lost_acks = rows["A", "exactly-once"]["cells"]
    assert {name: cell["measured"] for name, cell in lost_acks.items()} == dict.fromkeys(ANOMALIES, 0)
    # The zombie went on after its successor started, and fencing kept its batch from landing twice.
    zombie = rows["E", "exactly-once"]
    assert zombie["run"]["coverage"]["zombies_resumed"] > 0
    duplicated = zombie["cells"]["duplicated"]
    assert duplicated == {"predicted": NEVER, "measured": 0, "verdict": "clean", "agrees": True}
    # The hanging transaction's records reached the log, and its abort kept them from the readers.
    hanging = rows["F", "exactly-once"]
    assert hanging["run"]["coverage"]["aborted_records"] > 0
    aborted = hanging["cells"]["aborted_reads"]
    assert aborted == {"predicted": NEVER, "measured": 0, "verdict": "clean", "agrees": True}
    assert "0 never" in table


@pytest.mark.timeout(150)
def test_at_most_once_loses_fire_and_forget_sends_dropped_on_the_way(tmp_path: Path) -> None:
    rows, table = _matrix(tmp_path, "--failure", "C", "--guarantee", "at-most-once")
    cells = rows["C", "at-most-once"]["cells"]
    assert rows["C", "at-most-once"]["run"]["coverage"]["produce_requests_lost"] > 0
    assert cells["lost"]["measured"] and cells["lost"]["agrees"], "at-most-once may lose, and here it did"
    assert "may" in table
