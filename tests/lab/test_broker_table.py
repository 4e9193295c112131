"""`onceflow lab broker-table`: the command, and the table's verdicts, pictures and waits, on
made-up histories and metadata answers. The table measured on ZooKeeper and 3 brokers is the
demo's, checked row by row in tests/demo/test_demo.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from onceflow.cli import main
from onceflow.lab import broker_table
from onceflow.lab.broker_table import (
    AGREES,
    DISAGREES,
    NEVER_LOSES,
    NOT_TESTED,
    REFUSES,
    ROWS,
    SCENARIOS,
    Cluster,
    Row,
    problems,
    rows_to_run,
    settled,
)


def test_lab_broker_table_prints_the_rows_writes_json_and_html_and_fails_on_a_disagreement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command around the measurement. The measurement itself, on ZooKeeper and 3 brokers,
    is the demo's broker table, checked row by row in tests/demo/test_demo.py: one run of it in
    the suite instead of two (about 35 s each)."""
    lost = _row(0, _history("acks-1", ["before-0", "during-0"], ["before-0"]))
    refused = _row(2, _history("acks-all-alone", ["before-0"], ["before-0"]))
    during = {"time": 1.0, "process": "producer", "topic": "acks-all-alone", "value": "during-0"}
    refusal = {**during, "type": "fail", "error": "NOT_ENOUGH_REPLICAS"}
    refused.history[2:2] = [{**during, "type": "send"}, refusal]
    refused.sent_during_fault, refused.acknowledged_during_fault, refused.refused_during_fault = 1, 0, 1
    measured = [{**row.to_json(), "attempts": 1} for row in (lost, refused)]
    assert [mark["fate"] for mark in measured[1]["picture"]["marks"]] == ["kept", "refused"]
    workdirs: list[Path] = []

    def run_broker_table(workdir: Path, log: Any) -> list[dict[str, Any]]:
        workdirs.append(workdir)
        log("broker table: made up")
        return measured

    monkeypatch.setattr(broker_table, "run_broker_table", run_broker_table)
    report, page = tmp_path / "broker-table.json", tmp_path / "broker-table.html"
    assert main(["lab", "broker-table", "--json", str(report), "--html", str(page)]) == 0
    assert "broker table: 3 brokers" in capsys.readouterr().out
    assert json.loads(report.read_text()) == {"broker_table": measured}
    html = page.read_text()
    assert 'id="broker-row-1"' in html and 'id="broker-row-2"' in html
    assert "refused (NOT_ENOUGH_REPLICAS)" in html
    assert len(workdirs) == 1 and not workdirs[0].exists()  # a scratch directory, removed
    # Negative control: a row that disagrees with the documents fails the command and is named.
    kept_nothing = _row(1, _history("acks-all", ["before-0", "during-0"], ["before-0"]))
    measured.append({**kept_nothing.to_json(), "attempts": 1})
    assert main(["lab", "broker-table", "--workdir", str(tmp_path / "work")]) == 1
    assert "acks=all,isr>=2: lost 1 acknowledged" in capsys.readouterr().err
    assert workdirs[-1] == tmp_path / "work"


def _row(prediction_row: int, history: list[dict[str, Any]]) -> Row:
    row = rows_to_run()[prediction_row]
    row.history = history
    row.sent_during_fault = row.acknowledged_during_fault = 1
    return row


def _history(topic: str, acknowledged: list[str], read: list[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for offset, value in enumerate(acknowledged):
        events.append({"time": 1.0, "process": "producer", "type": "send", "topic": topic, "value": value})
        events.append(
            {"time": 1.0, "process": "producer", "type": "ack", "topic": topic, "value": value}
            | {"partition": 0, "offset": offset}
        )
    records = [[0, offset, value] for offset, value in enumerate(read)]
    events.append(
        {"time": 2.0, "process": "reader", "type": "read", "topic": topic, "isolation": "read_committed"}
        | {"records": records, "ends": [[0, len(read)]]}
    )
    return events


def test_an_acknowledged_value_missing_from_the_read_back_is_a_loss_and_breaks_never_loses() -> None:
    """Negative control: the checker must see a loss it is fed, and the verdict must follow."""
    row = _row(1, _history("acks-all", ["before-0", "during-0"], ["before-0"]))
    assert row.prediction == NEVER_LOSES
    judged = row.to_json()
    assert (judged["lost"], judged["lost_values"], judged["verdict"]) == (1, ["during-0"], DISAGREES)
    assert problems([judged]) == [
        "broker table, acks=all,isr>=2: lost 1 acknowledged, predicted to lose none"
    ]

    kept = _row(1, _history("acks-all", ["before-0", "during-0"], ["before-0", "during-0"])).to_json()
    assert (kept["lost"], kept["verdict"], problems([kept])) == (0, "agrees", [])


def test_a_row_whose_fault_acknowledged_nothing_is_not_tested_and_fails_the_run() -> None:
    row = _row(0, _history("acks-1", ["before-0"], ["before-0"]))
    row.acknowledged_during_fault = 0  # written during the lag, but none of it acknowledged
    judged = row.to_json()
    assert judged["verdict"] == NOT_TESTED
    assert problems([judged]) == [
        "broker table, acks=1: not tested (nothing was acknowledged during the fault)"
    ]


def test_a_may_lose_row_that_lost_nothing_is_not_tested() -> None:
    """The followers had every acknowledged value at the failover: the fault missed its point."""
    row = _row(0, _history("acks-1", ["before-0", "during-0"], ["before-0", "during-0"]))
    judged = row.to_json()
    assert (judged["lost"], judged["verdict"]) == (0, NOT_TESTED)
    assert problems([judged]) == [
        "broker table, acks=1: not tested (no acknowledged value was the leader's alone when it died)"
    ]
    lost = _row(0, _history("acks-1", ["before-0", "during-0"], ["before-0"])).to_json()
    assert (lost["lost"], lost["verdict"]) == (1, "agrees")


def test_a_later_attempt_writes_to_topics_of_its_own() -> None:
    first, second = rows_to_run(), rows_to_run(2)
    assert [row.topic for row in second] == [f"{row.topic}-2" for row in first]


def test_a_disagreement_is_kept_not_measured_again() -> None:
    # A fault is injected again when one of its rows tested nothing; a row that disagreed in
    # that attempt is a finding, and a clean second attempt must not replace it.
    assert settled([{"verdict": DISAGREES}, {"verdict": NOT_TESTED}])
    assert not settled([{"verdict": AGREES}, {"verdict": NOT_TESTED}])
    assert settled([{"verdict": AGREES}, {"verdict": AGREES}])


def test_a_refusing_row_agrees_only_when_every_write_during_the_fault_is_refused() -> None:
    row = _row(2, _history("acks-all-alone", ["before-0"], ["before-0"]))
    assert row.prediction == REFUSES
    row.sent_during_fault, row.acknowledged_during_fault, row.refused_during_fault = 5, 0, 5
    assert row.to_json()["verdict"] == AGREES
    # Negative controls: one write acknowledged with a single copy in sync, one left unanswered.
    row.acknowledged_during_fault, row.refused_during_fault = 1, 4
    judged = row.to_json()
    assert judged["verdict"] == DISAGREES
    assert problems([judged]) == [
        "broker table, acks=all,1 in sync: 1 acknowledged and 4 refused of 5 sent with one replica in sync,"
        " predicted all refused"
    ]
    row.acknowledged_during_fault, row.refused_during_fault = 0, 4
    assert row.to_json()["verdict"] == DISAGREES


def test_the_rows_are_data_each_naming_a_scenario() -> None:
    assert all(row.scenario in SCENARIOS for row in ROWS)
    assert len({row.name for row in ROWS}) == len({row.topic for row in ROWS}) == len(ROWS)


def test_a_rows_picture_shows_each_write_and_the_fault_it_was_sent_under() -> None:
    history = _history("acks-1", ["before-0", "during-0"], ["before-0"])
    history.insert(2, {"time": 1.0, "process": "lab", "type": "fault", "action": "followers-stopped"})
    history.append({"time": 2.0, "process": "lab", "type": "fault", "action": "followers-resumed"})
    picture = _row(0, history).to_json()["picture"]
    assert [(mark["value"], mark["fate"]) for mark in picture["marks"]] == [
        ("before-0", "kept"),
        ("during-0", "lost"),
    ]
    assert picture["bands"] == [{"label": "followers stopped (SIGSTOP)", "start": 0.0, "end": 1.0}]


class _Answers(Cluster):
    """A cluster whose metadata answers are given, in turn: what a real one answers while a new
    leader is elected, its view of the cluster a little behind ZooKeeper's."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__(Path("/nonexistent"))
        self.answers = answers

    def live(self) -> list[int]:
        return [2, 3]

    def metadata(self, topic: str | None = None) -> Any:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return SimpleNamespace(topics={} if answer is None else {topic: answer})


def _topic(leader: int | None) -> Any:
    partitions = {} if leader is None else {0: SimpleNamespace(leader=leader, isrs=[leader])}
    return SimpleNamespace(error=None, partitions=partitions)


def test_waiting_for_a_leader_returns_the_leader_it_saw() -> None:
    """The next answer may not have the partition yet: the leader the check saw is the answer
    (the demo once died of reading the metadata a second time: 'NoneType' has no 'leader')."""
    cluster = _Answers([None, _topic(None), _topic(1), _topic(2), _topic(None)])
    assert cluster.wait_for_leader("t", lambda leader: leader != 1) == 2
    assert cluster.answers == [_topic(None)]  # the answer after the one it used was never asked for


def test_a_partition_whose_metadata_lags_is_asked_again() -> None:
    """Whether the clean row's partition went offline is read from an answer that has it."""
    offline = SimpleNamespace(error=None, partitions={0: SimpleNamespace(leader=-1, isrs=[])})
    assert _Answers([None, _topic(None), offline]).wait_for_state("t").leader == -1


def test_the_exactly_once_row_disagrees_when_an_aborted_value_is_read_or_a_value_twice() -> None:
    """Negative controls: forged read-backs with a value of an aborted transaction, and with a
    committed value twice."""
    row = _row(5, _history("exactly-once", ["before-0", "during-0"], ["before-0", "during-0"]))
    row.aborted_values = ["aborted-0"]
    assert row.to_json()["verdict"] == AGREES
    row.history = _history("exactly-once", ["before-0", "during-0"], ["before-0", "aborted-0", "during-0"])
    judged = row.to_json()
    assert (judged["aborted_read_values"], judged["verdict"]) == (["aborted-0"], DISAGREES)
    row.history = _history("exactly-once", ["before-0", "during-0"], ["before-0", "during-0", "during-0"])
    judged = row.to_json()
    assert (judged["duplicated_values"], judged["verdict"]) == (["during-0"], DISAGREES)
    row.aborted_values = []
    assert row.to_json()["verdict"] == NOT_TESTED  # nothing aborted: aborted reads were not tested
