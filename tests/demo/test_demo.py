"""`onceflow demo --short` end to end: the lab and the Spark pipeline, the short matrix and the
broker table, the verdict and the reports (the broker table in report.html too). The broker table
measured here is the suite's only run of it on a real cluster, so its rows are checked in detail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from onceflow.demo import SHORT_MATRIX

pytestmark = [pytest.mark.spark, pytest.mark.soak, pytest.mark.zookeeper]

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
    # (The suite's only run of it on ZooKeeper and 3 brokers: tests/lab/test_broker_table.py
    # checks `onceflow lab broker-table`'s own output on rows made up there.)
    assert "broker table: 3 brokers" in demo.stdout
    check_broker_table(json.loads((report_dir / "broker-table.json").read_text())["broker_table"])

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
    assert 'id="broker-row-6"' in page


def check_broker_table(table_rows: list[dict[str, Any]]) -> None:
    """Each row of the measured broker table lost, refused or kept what the documents predict."""
    rows = {row["row"]: row for row in table_rows}
    assert list(rows) == [
        "acks=1",
        "acks=all,isr>=2",
        "acks=all,1 in sync",
        "unclean",
        "clean",
        "exactly-once",
    ]
    assert {row["verdict"] for row in rows.values()} == {"agrees"}, rows
    assert {row["attempts"] for row in rows.values()} <= {1, 2}
    # acks=1: acknowledged by the leader alone during the lag, gone with it.
    assert rows["acks=1"]["acknowledged_during_fault"] == 5
    assert rows["acks=1"]["lost"] >= 1
    assert "during-4" in rows["acks=1"]["lost_values"]
    # acks=all with min.insync.replicas=2: offered during the lag, never acknowledged, none lost.
    assert rows["acks=all,isr>=2"]["sent_during_fault"] == 5
    assert rows["acks=all,isr>=2"]["acknowledged_during_fault"] == 0
    assert rows["acks=all,isr>=2"]["lost"] == 0
    # acks=all with min.insync.replicas=2 and the leader alone in the ISR: every write refused.
    alone = rows["acks=all,1 in sync"]
    assert (
        alone["sent_during_fault"],
        alone["refused_during_fault"],
        alone["acknowledged_during_fault"],
    ) == (5, 5, 0)
    assert {mark["fate"] for mark in alone["picture"]["marks"] if mark["value"].startswith("during")} == {
        "refused"
    }
    # Unclean election: everything the leader alone acknowledged is cut; clean: nothing.
    assert rows["unclean"]["lost_values"] == [f"during-{index}" for index in range(5)]
    assert rows["clean"]["acknowledged_during_fault"] == 5
    assert rows["clean"]["lost"] == 0
    # Exactly-once: the transaction open when its coordinator died commits through the new one.
    exactly_once = rows["exactly-once"]
    assert exactly_once["acknowledged_during_fault"] == 5
    assert (exactly_once["lost"], exactly_once["duplicated_values"], exactly_once["aborted_read_values"]) == (
        0,
        [],
        [],
    )
