"""Short lab runs on the lab's own broker: with a broker fault the checker reports the matching
anomaly with the values and offsets the fault hit (it can fail), and says the fault was caught; a
run that never creates an anomaly's preconditions says "not tested" for it; and exactly-once with
aborted transactions in the log is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.lab.checker import (
    ABORTED_READ,
    DUPLICATE,
    LOST_DOWNSTREAM,
    LOST_WRITE,
    CheckResult,
    check,
    final_reads,
)
from onceflow.lab.controls import CAUGHT
from onceflow.lab.coverage import CLEAN, FOUND, NOT_TESTED
from onceflow.lab.history import read_history
from onceflow.lab.runner import RunResult, Scenario, run_scenario
from onceflow.lab.transactions import fates

MESSAGES = 160
PRODUCE_S = 3.0


def _run(tmp_path: Path, guarantee: str, faults: tuple[str, ...], broker_fault: str | None) -> RunResult:
    scenario = Scenario(guarantee, faults, MESSAGES, 5, None, broker_fault, PRODUCE_S)
    result = run_scenario(scenario, tmp_path)
    assert result.drained, result.injected
    return result


def _check(events: list[dict[str, object]], input_topic: str) -> CheckResult:
    return check(events, input_topic, input_topic.removesuffix("-input") + "-output")


def _values(result: RunResult, *kinds: str) -> set[str]:
    return {value for anomaly in result.check.of_kind(*kinds) for value in anomaly.values}


@pytest.mark.timeout(150)
def test_a_broker_serving_aborted_records_to_every_reader_fails_exactly_once(tmp_path: Path) -> None:
    """Every read_committed read, the final ones too, returns aborted records: the broker's own
    reads show none aborted, so only the history can tell. `lab run` reports the aborted reads,
    says the fault was caught, and exits 1; its control, the same run without the fault, is clean
    with the same coverage."""
    report, workdir = tmp_path / "lab.json", tmp_path / "work"
    command = [
        sys.executable, "-m", "onceflow.cli", "lab", "run", "--guarantee", "exactly-once", "--faults", "",
        "--messages", str(MESSAGES), "--seconds", str(PRODUCE_S), "--seed", "5",
        "--broker-fault", "serve-aborted", "--json", str(report), "--workdir", str(workdir),
    ]  # fmt: skip
    faulty = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        (tmp_path / "control").mkdir()
        control = _run(tmp_path / "control", "exactly-once", (), None)  # meanwhile
        stdout, stderr = faulty.communicate(timeout=130)
    finally:
        if faulty.poll() is None:
            faulty.kill()
            faulty.wait()
    assert faulty.returncode == 1, stderr[-3000:]
    assert "broker fault serve-aborted: expected: caught — caught" in stdout
    assert "broken promise: exactly-once never reads aborted data" in stderr
    [run] = json.loads(report.read_text())["runs"]
    assert run["aborted_reads"] > 0 and run["verdicts"]["aborted_reads"] == FOUND
    assert run["control"]["verdict"] == CAUGHT
    # The broker's own reads hid its aborted records: the cross-check says so.
    events = read_history(next(workdir.glob("run-*")) / "history")
    [input_topic] = {e["topic"] for e in events if e["type"] == "read" and e["topic"].endswith("-input")}
    assert final_reads(events)[input_topic].aborted() == {}
    aborted = fates(events).aborted(input_topic)
    assert run["coverage"]["aborted_records"] == len(aborted) > 0
    assert not run["cross_check"]["agrees"] and run["cross_check"]["differ"] >= len(aborted)
    polled = {
        (anomaly.offsets[0][1:], anomaly.values[0])
        for anomaly in _check(events, input_topic).of_kind(ABORTED_READ)
        if "worker" in anomaly.detail
    }
    assert polled == set(aborted.items())  # every aborted record reached a worker, at its offset
    # The control: the same aborts, none of them read.
    assert control.coverage["aborted_records"] == len(aborted)
    assert control.check.anomalies == [] and control.verdicts["aborted_reads"] == CLEAN
    assert control.cross_check["agrees"] and control.cross_check["compared"] > 0
    assert control.control is None


@pytest.mark.timeout(120)
def test_a_broker_losing_acknowledged_writes_is_caught(tmp_path: Path) -> None:
    result = _run(tmp_path, "at-least-once", (), "drop-acked-produce")
    assert result.broker_fault_effects is not None
    dropped = set(result.broker_fault_effects["dropped_values"])
    assert dropped and _values(result, LOST_WRITE, LOST_DOWNSTREAM) == dropped
    assert result.verdicts == {"lost": FOUND, "duplicated": NOT_TESTED}
    assert result.control is not None and result.control["verdict"] == CAUGHT


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
    assert result.control is not None and result.control["verdict"] == CAUGHT


@pytest.mark.timeout(120)
def test_exactly_once_with_aborted_transactions_in_the_log_is_clean(tmp_path: Path) -> None:
    result = _run(tmp_path, "exactly-once", ("producer-crash", "consumer-crash"), None)
    assert result.coverage["aborted_records"] > 0
    assert result.coverage["resent_by_new_session"] > 0  # the killed producer's transaction, sent again
    assert result.coverage["consumers_killed_before_commit"] > 0
    assert result.coverage["producers_killed_mid_batch"] > 0
    assert result.check.anomalies == []
    assert result.verdicts == {"lost": CLEAN, "duplicated": CLEAN, "aborted_reads": CLEAN}
    assert result.cross_check["agrees"] and result.cross_check["compared"] > 0


@pytest.mark.timeout(330)
def test_a_run_without_preconditions_reports_not_tested_and_fails(tmp_path: Path) -> None:
    # Without faults nothing should repeat a record, unless the machine stalls the run: a producer
    # (a worker's too) times a request out and sends it again, a lost ack of the machine's own
    # making; or the broker ends a stalled worker's group session, and another worker processes
    # its uncommitted records again. Both duplicates are real (seen under a loaded machine), and
    # each leaves a trace (below). Such a run has not tested the control's precondition: it runs
    # again. A duplicate without any trace fails, and so does one in every run.
    for attempt in range(3):
        report = tmp_path / f"lab-{attempt}.json"
        work = tmp_path / f"work-{attempt}"
        command = [
            sys.executable, "-m", "onceflow.cli", "lab", "run", "--guarantee", "at-least-once",
            "--faults", "", "--messages", "40", "--seconds", "1", "--json", str(report),
            "--workdir", str(work),
        ]  # fmt: skip
        completed = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=100,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert completed.returncode == 1, completed.stderr[-3000:]
        [run] = json.loads(report.read_text())["runs"]
        stalled = _traces_of_a_stall(run, work)
        if not (run["duplicated"] and stalled):
            break
        print(f"attempt {attempt}: {run['duplicated']} duplicated after a stall: {stalled}")
    assert "lost, duplicated not tested" in completed.stderr
    assert "not tested" in completed.stdout
    assert run["lost"] == run["duplicated"] == 0, _traces_of_a_stall(run, work)
    assert set(run["coverage"].values()) == {0}
    assert run["verdicts"] == {"lost": NOT_TESTED, "duplicated": NOT_TESTED}


def _traces_of_a_stall(run: dict[str, object], work: Path) -> list[str]:
    """What a stalled machine leaves in a run without faults: a client that logged anything (a
    timed-out request, a failed heartbeat or commit: a calm run logs nothing), a client started
    again (one that died of a failed commit), or the lab's liveness probe killing stuck workers."""
    logs = sorted(work.glob("*/logs/*.log"))
    logged = [
        f"{log.stem} logged {log.read_text(errors='replace')[:200]!r}" for log in logs if log.stat().st_size
    ]
    restarted = [f"{log.stem} started again" for log in logs if not log.stem.endswith(".0")]
    injected = run["injected"]
    assert isinstance(injected, list)
    return logged + restarted + [str(action) for action in injected]
