"""A Spark pipeline run in the reports: counted in payments in every column (a payment copied on both
output topics is one duplicated payment, not four records), with a timeline that marks the driver
kill, and the same counts in the table and the run's section."""

from __future__ import annotations

from collections import Counter

from onceflow.demo import pipeline_run, pipeline_timeline
from onceflow.lab.report import render_html
from onceflow.pipeline.events import make_workload
from onceflow.pipeline.process import Outputs

MOMENTS = {"start": 100.0, "generated": 101.0, "driver": 101.5, "killed": 110.0, "restarted": 110.1}
MOMENTS |= {"finished": 130.0, "checked": 131.0}


def test_a_pipeline_run_counts_payments_in_every_column() -> None:
    workload = make_workload(80, seed=3, abort_ratio=0.3)
    expected = sorted(workload.expected_payments())
    order_status, seats = Counter(expected), Counter(expected)
    order_status[expected[0]] += 1  # copied on both topics: one duplicated payment
    seats[expected[0]] += 1
    order_status[expected[1]] += 2  # three copies on one topic: one duplicated payment
    del seats[expected[2]]  # half a booking: lost
    aborted = sorted(workload.aborted_payments())[0]
    order_status[aborted] += 1
    run = pipeline_run(
        "at-least-once", 3, workload, Outputs(order_status, seats, 0), dict(workload.expected_balances())
    )
    assert run["unit"] == "payments"
    assert (run["produced"], run["delivered"]) == (len(expected), len(expected) - 1)
    assert (run["lost"], run["duplicated"], run["aborted_reads"]) == (1, 2, 1)
    details = sorted(anomaly["detail"] for anomaly in run["anomalies"] if anomaly["kind"] == "duplicate")
    assert details == [
        "copies: 2 on order-status, 2 on seat-reservations",
        "copies: 3 on order-status, 1 on seat-reservations",
    ]
    assert run["balances_match"]
    page = render_html([{**run, "timeline": pipeline_timeline(MOMENTS)}])
    assert "Duplicated: 2 payments (2 findings: duplicate 2)" in page
    assert "Lost: 1 payments (1 findings: lost-write 1)" in page


def test_a_pipeline_run_draws_its_timeline_with_the_driver_kill() -> None:
    drawn = pipeline_timeline(MOMENTS)
    [driver] = [lane for lane in drawn["lanes"] if lane["name"] == "spark driver"]
    assert [(span["start"], span["end"], span["replaced"]) for span in driver["spans"]] == [
        (1.5, 10.0, True),
        (10.1, 30.0, False),
    ]
    assert drawn["bands"][0]["label"].startswith("driver SIGKILLed")
    workload = make_workload(20, seed=3)
    expected = Counter(workload.expected_payments())
    run = pipeline_run(
        "exactly-once", 3, workload, Outputs(expected, expected, 0), dict(workload.expected_balances())
    )
    page = render_html([{**run, "timeline": drawn}])
    assert 'id="timeline-1"' in page and 'class="kill"' in page
    assert 'id="rates-1"' not in page  # no sends to draw: no empty chart
