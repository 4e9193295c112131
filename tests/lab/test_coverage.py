"""Coverage counted from synthetic histories: each kind of killed incarnation is recognised, a
client's last incarnation is left out, and a check without preconditions is "not tested"."""

from __future__ import annotations

from typing import Any

from onceflow.lab.checker import LOST_WRITE, Anomaly, CheckResult
from onceflow.lab.coverage import CLEAN, FOUND, NOT_TESTED, measure, verdicts
from onceflow.lab.history import Event


def _event(type_: str, process: str, **fields: Any) -> Event:
    return {"time": 0.0, "process": process, "type": type_, **fields}


def _poll(process: str) -> Event:
    return _event("poll", process, topic="input", isolation="read_committed", records=[[0, 0, "a"]])


def _commit(process: str) -> Event:
    return _event("commit", process, topic="input", offsets=[[0, 1]])


def _processed(process: str) -> Event:
    return _event("processed", process, topic="input", offsets=[[0, 1]])


def _read(isolation: str, records: list[list[Any]], end: int) -> Event:
    return _event("read", "final-read", topic="input", isolation=isolation, records=records, ends=[[0, end]])


def test_killed_workers_are_told_apart_by_what_they_left_undone() -> None:
    events = [
        _poll("worker-0.0"),  # died before committing
        *[_poll("worker-0.1"), _commit("worker-0.1")],  # died after committing, before output
        *[_poll("worker-0.2"), _processed("worker-0.2"), _commit("worker-0.2")],  # finished its batch
        _poll("worker-0.3"),  # the last incarnation: stopped by the lab after the drain
    ]
    counts = measure(events, "input", acks_lost=0, broker_kills=0)
    assert counts["consumers_killed_before_commit"] == 1
    assert counts["consumers_killed_before_output"] == 1


def test_a_worker_that_went_on_after_a_pause_is_a_zombie_not_a_crash() -> None:
    events = [
        _poll("worker-0.0"),
        _event("pause", "worker-0.0", point="before-commit"),
        _event("resume", "worker-0.0", point="before-commit"),  # its successor had started
        _poll("worker-0.1"),
    ]
    counts = measure(events, "input", acks_lost=0, broker_kills=0)
    assert counts["zombies_resumed"] == 1
    assert counts["consumers_killed_before_commit"] == 0


def test_a_producer_killed_with_its_last_send_unsettled_was_killed_mid_batch() -> None:
    def send(process: str, value: str) -> Event:
        return _event("send", process, topic="input", value=value)

    events = [
        send("producer-0.0", "a"),  # killed with "a" in flight
        *[send("producer-0.1", "b"), _event("ack", "producer-0.1", value="b")],
        *[send("producer-0.2", "c"), _event("txn", "producer-0.2", outcome="aborted", values=["c"])],
        send("producer-0.3", "d"),  # the last incarnation
    ]
    assert measure(events, "input", acks_lost=0, broker_kills=0)["producers_killed_mid_batch"] == 1


def _written(process: str, value: str, offset: int) -> Event:
    return _event("written", process, topic="input", value=value, partition=0, offset=offset)


def test_aborted_records_are_counted_from_the_history_where_readers_read_past_them() -> None:
    events = [
        # Aborted as their producer saw it: "x" and "y" ...
        *[_written("producer-0.0", "x", 1), _written("producer-0.0", "y", 2)],
        _event("txn", "producer-0.0", topic="input", outcome="aborted", values=["x", "y"]),
        # ... and "z", whose producer died before asking to commit, but no reader got that far.
        _written("producer-0.1", "z", 6),
        _event(
            "poll",
            "worker-0.0",
            topic="input",
            isolation="read_committed",
            records=[[0, 0, "a"], [0, 3, "d"]],
        ),
        # The broker's own reads count for nothing: here they show no aborted record at all.
        _read("read_committed", [[0, 0, "a"], [0, 1, "x"], [0, 2, "y"], [0, 3, "d"]], 5),
        _read("read_uncommitted", [[0, 0, "a"], [0, 1, "x"], [0, 2, "y"], [0, 3, "d"], [0, 6, "z"]], 7),
    ]
    assert measure(events, "input", acks_lost=2, broker_kills=1, produce_requests_lost=3) == {
        "aborted_records": 2,
        "acks_lost": 2,
        "produce_requests_lost": 3,
        "broker_kills": 1,
        "producers_killed_mid_batch": 0,
        "resent_by_new_session": 0,
        "consumers_killed_before_commit": 0,
        "consumers_killed_before_output": 0,
        "zombies_resumed": 0,
    }


def test_a_value_stored_for_one_producer_session_and_sent_by_the_next_is_a_resend() -> None:
    def send(process: str, value: str) -> Event:
        return _event("send", process, topic="input", value=value)

    stored = _event("unhandled-ack", "producer-0.0", topic="input", value="a", partition=0, offset=4)
    events = [
        *[send("producer-0.0", "a"), stored, send("producer-0.0", "b")],
        *[send("producer-0.1", "a"), send("producer-0.1", "b")],  # "b" was never stored: not counted
        send("producer-1.0", "a"),  # another producer's value of the same name
    ]
    assert measure(events, "input", acks_lost=0, broker_kills=0)["resent_by_new_session"] == 1


def test_a_check_without_preconditions_is_not_tested() -> None:
    nothing = measure([], "input", acks_lost=0, broker_kills=0)
    assert verdicts(CheckResult(3, 3, 3), nothing, read_committed=True) == {
        "lost": NOT_TESTED,
        "duplicated": NOT_TESTED,
        "aborted_reads": NOT_TESTED,
    }
    # read_uncommitted readers cannot read an aborted record they should have skipped.
    assert "aborted_reads" not in verdicts(CheckResult(3, 3, 3), nothing, read_committed=False)
    some = {**nothing, "aborted_records": 4, "acks_lost": 1}
    assert verdicts(CheckResult(3, 3, 3), some, read_committed=True) == {
        "lost": CLEAN,
        "duplicated": CLEAN,
        "aborted_reads": CLEAN,
    }


def test_an_anomaly_found_is_found_whatever_the_coverage() -> None:
    result = CheckResult(3, 3, 2, [Anomaly(LOST_WRITE, ["c"], [], "acknowledged, but not in the final read")])
    nothing = measure([], "input", acks_lost=0, broker_kills=0)
    assert verdicts(result, nothing, read_committed=False) == {"lost": FOUND, "duplicated": NOT_TESTED}
