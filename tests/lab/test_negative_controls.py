"""Short lab runs on the lab's own broker: with a broker fault the checker reports the matching
anomaly with the values and offsets the fault hit (it can fail), a run that never creates an
anomaly's preconditions says "not tested" for it, and exactly-once with aborted transactions in the
log is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.lab.checker import ABORTED_READ, DUPLICATE, LOST_DOWNSTREAM, LOST_WRITE, final_reads
from onceflow.lab.coverage import CLEAN, FOUND, NOT_TESTED
from onceflow.lab.history import read_history
from onceflow.lab.runner import RunResult, Scenario, run_scenario

MESSAGES = 160
PRODUCE_S = 3.0


def _run(tmp_path: Path, guarantee: str, faults: tuple[str, ...], broker_fault: str | None) -> RunResult:
    scenario = Scenario(guarantee, faults, MESSAGES, 5, None, broker_fault, PRODUCE_S)
    result = run_scenario(scenario, tmp_path)
    assert result.drained, result.injected
    return result


def _values(result: RunResult, *kinds: str) -> set[str]:
    return {value for anomaly in result.check.of_kind(*kinds) for value in anomaly.values}


@pytest.mark.timeout(120)
def test_a_broker_serving_aborted_records_to_read_committed_readers_is_caught(tmp_path: Path) -> None:
    result = _run(tmp_path, "exactly-once", (), "serve-aborted")
    events = read_history(tmp_path / "history")
    [input_topic] = {e["topic"] for e in events if e["type"] == "read" and e["topic"].endswith("-input")}
    in_log = final_reads(events)[input_topic].aborted()
    assert result.coverage["aborted_records_in_log"] == len(in_log) > 0
    polled = {
        (anomaly.offsets[0], anomaly.values[0])
        for anomaly in result.check.of_kind(ABORTED_READ)
        if "read a record of an aborted transaction" in anomaly.detail
    }
    # Every aborted record reached a worker, at its offset in the log.
    assert polled == {((input_topic, p, o), value) for (p, o), value in in_log.items()}
    assert result.verdicts == {"lost": NOT_TESTED, "duplicated": NOT_TESTED, "aborted_reads": FOUND}


@pytest.mark.timeout(120)
def test_a_broker_losing_acknowledged_writes_is_caught(tmp_path: Path) -> None:
    result = _run(tmp_path, "at-least-once", (), "drop-acked-produce")
    assert result.broker_fault_effects is not None
    dropped = set(result.broker_fault_effects["dropped_values"])
    assert dropped and _values(result, LOST_WRITE, LOST_DOWNSTREAM) == dropped
    assert result.verdicts == {"lost": FOUND, "duplicated": NOT_TESTED}


@pytest.mark.timeout(120)
def test_a_broker_storing_writes_twice_is_caught(tmp_path: Path) -> None:
    result = _run(tmp_path, "at-least-once", (), "duplicate-produce")
    assert result.broker_fault_effects is not None
    copied = set(result.broker_fault_effects["duplicated_values"])
    assert copied and _values(result, DUPLICATE) == copied
    for anomaly in result.check.of_kind(DUPLICATE):
        # A copied input value is processed twice, and each output copy may be copied again.
        assert len(set(anomaly.offsets)) == len(anomaly.offsets) >= 2, anomaly
    assert result.verdicts == {"lost": NOT_TESTED, "duplicated": FOUND}


@pytest.mark.timeout(120)
def test_exactly_once_with_aborted_transactions_in_the_log_is_clean(tmp_path: Path) -> None:
    result = _run(tmp_path, "exactly-once", ("producer-crash", "consumer-crash"), None)
    assert result.coverage["aborted_records_in_log"] > 0
    assert result.coverage["consumers_killed_before_commit"] > 0
    assert result.coverage["producers_killed_mid_batch"] > 0
    assert result.check.anomalies == []
    assert result.verdicts == {"lost": CLEAN, "duplicated": CLEAN, "aborted_reads": CLEAN}


@pytest.mark.timeout(120)
def test_a_run_without_preconditions_reports_not_tested_and_fails(tmp_path: Path) -> None:
    report = tmp_path / "lab.json"
    command = [
        sys.executable, "-m", "onceflow.cli", "lab", "run", "--guarantee", "at-least-once",
        "--faults", "", "--messages", "40", "--seconds", "1", "--json", str(report),
        "--workdir", str(tmp_path / "work"),
    ]  # fmt: skip
    completed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert "lost, duplicated not tested" in completed.stderr
    assert "not tested" in completed.stdout
    [run] = json.loads(report.read_text())["runs"]
    assert run["lost"] == run["duplicated"] == 0
    assert set(run["coverage"].values()) == {0}
    assert run["verdicts"] == {"lost": NOT_TESTED, "duplicated": NOT_TESTED}
