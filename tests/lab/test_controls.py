"""Negative controls judged on made-up runs: a broker fault is caught when the checker reports what
it did, MISSED otherwise (which fails `lab run`), and not applicable when it had nothing to hit."""

from __future__ import annotations

from typing import Any

from onceflow.lab.controls import CAUGHT, MISSED, NOT_APPLICABLE, judge, line
from onceflow.lab.report import problems


def _run(
    fault: str, effects: dict[str, Any], anomalies: list[tuple[str, str]], **coverage: int
) -> dict[str, Any]:
    return {
        "guarantee": "exactly-once",
        "faults": [],
        "broker_fault": fault,
        "broker_fault_effects": {
            "fetches_rewritten": 0,
            "dropped_values": [],
            "duplicated_values": [],
            **effects,
        },
        "coverage": coverage,
        "verdicts": {},
        "lost": 0,
        "duplicated": 0,
        "aborted_reads": 0,
        "anomalies": [
            {"kind": kind, "values": [value], "offsets": [], "detail": ""} for kind, value in anomalies
        ],
    }


def test_serve_aborted_is_caught_with_counts_of_distinct_records() -> None:
    # Ten aborted records, each read by a worker, by the final read and passed downstream.
    read = [("aborted-read", f"v{n}") for n in range(10) for _ in range(3)]
    run = _run("serve-aborted", {"fetches_rewritten": 40}, read, aborted_records=10)
    control = judge(run, acknowledged=())
    assert control is not None and control["verdict"] == CAUGHT
    assert control["found"] == "10 aborted records read, of 10 aborted records read past"
    assert line(control).startswith("broker fault serve-aborted: expected: caught — caught (aborted reads;")


def test_a_fault_the_checker_does_not_report_is_missed_and_fails_the_run() -> None:
    run = _run("serve-aborted", {"fetches_rewritten": 40}, [], aborted_records=10)
    run["control"] = control = judge(run, acknowledged=())
    assert control is not None and control["verdict"] == MISSED
    assert problems([run]) == [f"exactly-once / no faults / broker fault serve-aborted: {line(control)}"]


def test_a_fault_with_nothing_to_hit_is_not_applicable() -> None:
    control = judge(_run("serve-aborted", {"fetches_rewritten": 40}, []), acknowledged=())
    assert control is not None and control["verdict"] == NOT_APPLICABLE
    assert judge({**_run("serve-aborted", {}, []), "broker_fault": None}, ()) is None


def test_dropped_writes_count_only_where_a_producer_saw_them_acknowledged() -> None:
    effects = {"dropped_values": ["a", "b", "c"]}  # "c" was in a transaction that aborted
    caught = judge(
        _run("drop-acked-produce", effects, [("lost-write", "a"), ("lost-write", "b")]), {"a", "b"}
    )
    assert caught is not None and (caught["verdict"], caught["did"]) == (
        CAUGHT,
        "2 values acknowledged and dropped",
    )
    missed = judge(_run("drop-acked-produce", effects, [("lost-write", "a")]), {"a", "b"})
    assert missed is not None and missed["verdict"] == MISSED


def test_copied_writes_must_all_be_reported_duplicated() -> None:
    effects = {"duplicated_values": ["x", "y"]}
    for reported, verdict in ((["x", "y"], CAUGHT), (["x"], MISSED)):
        control = judge(_run("duplicate-produce", effects, [("duplicate", value) for value in reported]), ())
        assert control is not None and control["verdict"] == verdict
