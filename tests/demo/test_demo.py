"""`onceflow demo --short` end to end: the lab and the Spark pipeline, the short matrix and the
broker table, the verdict and the reports (the broker table in report.html too)."""

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
    assert "Traceback" not in demo.stdout + demo.stderr
    assert "exactly-once: 0 lost, 0 duplicated, 0 aborted reads" in demo.stdout
    # The short matrix: every cell kept its promises and put one to the test.
    assert "delivery-semantics matrix" in demo.stdout
    rows = json.loads((report_dir / "matrix.json").read_text())["matrix"]
    assert len(rows) == len(SHORT_MATRIX) and all(row["agrees"] is True for row in rows), rows
    cells = {(row["failure"], row["guarantee"]): row for row in rows}
    # The documents' formula: within one producer session lost acks duplicate nothing ...
    within = cells["A", "idempotent"]
    assert within["run"]["coverage"]["acks_lost"] > 0 and within["cells"]["duplicated"]["measured"] == 0
    # ... a restarted producer is a new session, whose sends of stored values are stored again ...
    across = cells["B", "idempotent"]
    assert across["run"]["coverage"]["resent_by_new_session"] > 0
    assert (
        across["cells"]["duplicated"]["measured"] > 0 and across["cells"]["duplicated"]["predicted"] == "may"
    )
    # ... and with transactions the earlier copies were aborted: none.
    transactional = cells["B", "exactly-once"]
    assert transactional["run"]["coverage"]["resent_by_new_session"] > 0
    assert transactional["cells"]["duplicated"]["measured"] == 0

    # The broker table, on a cluster of its own: every row agrees with the documents' prediction.
    assert "broker table: 3 brokers" in demo.stdout
    table = {
        row["row"]: row for row in json.loads((report_dir / "broker-table.json").read_text())["broker_table"]
    }
    assert all(row["verdict"] == "agrees" for row in table.values()), table
    assert table["acks=1"]["lost"] > 0 and table["unclean"]["lost"] > 0
    assert table["acks=all,isr>=2"]["lost"] == 0 and table["clean"]["lost"] == 0
    assert (
        table["acks=all,1 in sync"]["refused_during_fault"]
        == table["acks=all,1 in sync"]["sent_during_fault"]
        > 0
    )

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
        ("lab", "idempotent"),
        ("lab", "exactly-once"),
        ("spark pipeline", "at-least-once"),
        ("spark pipeline", "exactly-once"),
    }
    pipeline = {run["guarantee"]: run for run in report["runs"] if run["stage"] == "spark pipeline"}
    assert pipeline["exactly-once"]["balances_match"]
    # The driver died with a micro-batch written but not checkpointed: at-least-once writes it twice,
    # counted in payments (each at most once, whatever its copies on the two topics).
    assert 0 < pipeline["at-least-once"]["duplicated"] <= pipeline["at-least-once"]["produced"]
    assert pipeline["at-least-once"]["unit"] == "payments"
    assert any(
        span["replaced"] for lane in pipeline["exactly-once"]["timeline"]["lanes"] for span in lane["spans"]
    )
    page = (report_dir / "report.html").read_text()
    assert "<svg" in page and "Matrix: each failure alone" in page
    assert "Broker table" in page and "refused (NOT_ENOUGH_REPLICAS)" in page
