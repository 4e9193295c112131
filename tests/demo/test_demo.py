"""`onceflow demo --short` end to end: the lab and the Spark pipeline, the verdict and the reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.demo import SHORT_MATRIX

pytestmark = [pytest.mark.spark, pytest.mark.soak]

RUN_KEYS = {
    "guarantee": str,
    "faults": list,
    "produced": int,
    "acknowledged": int,
    "delivered": int,
    "lost": int,
    "duplicated": int,
    "aborted_reads": int,
    "anomalies": list,
}


@pytest.mark.timeout(900)
def test_demo_runs_end_to_end_and_writes_valid_reports(tmp_path: Path) -> None:
    report_dir = tmp_path / "demo-report"
    demo = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "demo", "--short", "--report-dir", str(report_dir)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert demo.returncode == 0, demo.stdout[-5000:] + demo.stderr[-5000:]
    assert "exactly-once: 0 lost, 0 duplicated, 0 aborted reads" in demo.stdout
    # The short matrix: every cell kept its promises and put one to the test.
    assert "delivery-semantics matrix" in demo.stdout
    rows = json.loads((report_dir / "matrix.json").read_text())["matrix"]
    assert len(rows) == len(SHORT_MATRIX) and all(row["agrees"] is True for row in rows), rows

    # The broker table, on a cluster of its own: every row agrees with the documents' prediction.
    assert "broker table: 3 brokers" in demo.stdout
    table = {
        row["row"]: row for row in json.loads((report_dir / "broker-table.json").read_text())["broker_table"]
    }
    assert all(row["verdict"] == "agrees" for row in table.values()), table
    assert table["acks=1"]["lost"] > 0 and table["unclean"]["lost"] > 0
    assert table["acks=all,isr>=2"]["lost"] == 0 and table["clean"]["lost"] == 0

    report = json.loads((report_dir / "report.json").read_text())
    assert set(report) == {"runs"}
    for run in report["runs"]:
        for key, kind in RUN_KEYS.items():
            assert isinstance(run[key], kind), (key, run)
        for anomaly in run["anomalies"]:
            assert {"kind", "values", "offsets"} <= set(anomaly)
    stages = {(run["stage"], run["guarantee"]) for run in report["runs"]}
    assert stages == {
        ("lab", "at-most-once"),
        ("lab", "at-least-once"),
        ("lab", "exactly-once"),
        ("spark pipeline", "at-least-once"),
        ("spark pipeline", "exactly-once"),
    }
    pipeline = {run["guarantee"]: run for run in report["runs"] if run["stage"] == "spark pipeline"}
    assert pipeline["exactly-once"]["balances_match"]
    # The driver died with a micro-batch written but not checkpointed: at-least-once writes it twice.
    assert pipeline["at-least-once"]["duplicated"] > 0
    page = (report_dir / "report.html").read_text()
    assert "<svg" in page and "Matrix: each failure alone" in page
