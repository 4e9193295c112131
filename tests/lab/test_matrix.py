"""`onceflow lab matrix` on a part of the matrix: every cell's measurement keeps its guarantee's
promise, and the promises were put to the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.lab.matrix import ANOMALIES, MAY, NEVER

pytestmark = pytest.mark.soak


@pytest.mark.timeout(150)
def test_the_matrix_keeps_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "matrix.json"
    completed = subprocess.run(
        [
            sys.executable, "-m", "onceflow.cli", "lab", "matrix", "--failure", "A", "--failure", "C",
            "--guarantee", "at-most-once", "--guarantee", "exactly-once", "--seed", "3", "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=140,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert max(len(line) for line in completed.stdout.splitlines()) <= 80, completed.stdout
    rows = {(row["failure"], row["guarantee"]): row for row in json.loads(out.read_text())["matrix"]}
    assert set(rows) == {(f, g) for f in "AC" for g in ("at-most-once", "exactly-once")}
    for (failure, guarantee), row in rows.items():
        assert row["agrees"] is not False, (failure, guarantee, row["cells"], row["run"]["anomalies"][:3])
        assert row["run"]["drained"], row["run"]["injected"]
        for anomaly, cell in row["cells"].items():
            assert anomaly in ANOMALIES and cell["predicted"] in (MAY, NEVER)
    # Exactly-once under lost acks: every promise tested and kept.
    exactly_once = rows["A", "exactly-once"]["cells"]
    assert {name: cell["measured"] for name, cell in exactly_once.items()} == dict.fromkeys(ANOMALIES, 0)
    # A fire-and-forget send dropped on the way is lost, as at-most-once allows, and nothing repeats.
    at_most_once = rows["C", "at-most-once"]["cells"]
    assert at_most_once["lost"]["measured"] and at_most_once["lost"]["agrees"]
    assert rows["C", "exactly-once"]["cells"]["lost"]["measured"] == 0
    assert "0 never" in completed.stdout and "may" in completed.stdout
