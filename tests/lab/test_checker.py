"""The checker against synthetic histories: each planted anomaly is found, with its values and
offsets, and clean histories (also random ones) yield none. Which records were aborted comes from
the clients' history: a broker whose reads hide its aborted records cannot hide an aborted read."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.lab.checker import (
    ABORTED_READ,
    DUPLICATE,
    INCONSISTENT_OFFSET,
    LOST_DOWNSTREAM,
    LOST_WRITE,
    NON_MONOTONIC_POLL,
    SKIPPING_POLL,
    Anomaly,
    check,
    log_agreement,
)
from onceflow.lab.history import Event, HistoryWriter, read_history

Record = list[Any]  # [partition, offset, value]


def _event(type_: str, process: str = "p", **fields: Any) -> Event:
    return {"time": 0.0, "process": process, "type": type_, **fields}


def _sent_and_acked(records: list[Record], topic: str = "input") -> list[Event]:
    events = []
    for partition, offset, value in records:
        events.append(_event("send", "producer-0.0", topic=topic, value=value))
        events.append(
            _event("ack", "producer-0.0", topic=topic, value=value, partition=partition, offset=offset)
        )
    return events


def _read(topic: str, records: list[Record], isolation: str = "read_committed") -> Event:
    ends: dict[int, int] = {}
    for partition, offset, _value in records:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return _event(
        "read", "final-read", topic=topic, isolation=isolation, records=records, ends=sorted(ends.items())
    )


def _final(input_records: list[Record], output_records: list[Record]) -> list[Event]:
    return [
        _read("input", input_records),
        _read("input", input_records, "read_uncommitted"),
        _read("output", output_records),
        _read("output", output_records, "read_uncommitted"),
    ]


def _transaction(
    records: list[Record], outcome: str | None, process: str = "producer-0.0", commit_asked: bool = True
) -> list[Event]:
    """A transactional producer's records as the broker acknowledged them, then how the
    transaction ended as the client saw it (None: the process died before an answer)."""
    events = []
    for partition, offset, value in records:
        events.append(_event("send", process, topic="input", value=value))
        events.append(
            _event("written", process, topic="input", value=value, partition=partition, offset=offset)
        )
    if commit_asked and outcome != "aborted":
        events.append(_event("commit-txn", process, topic="input"))
    if outcome is not None:
        values = sorted(value for _p, _o, value in records)
        events.append(_event("txn", process, topic="input", outcome=outcome, values=values))
    if outcome == "committed":
        events += [
            _event("ack", process, topic="input", value=value, partition=partition, offset=offset)
            for partition, offset, value in records
        ]
    return events


def _poll(process: str, records: list[Record], isolation: str = "read_committed") -> Event:
    return _event("poll", process, topic="input", isolation=isolation, records=records)


def _only(anomalies: list[Anomaly], kind: str) -> Anomaly:
    assert [anomaly.kind for anomaly in anomalies] == [kind], anomalies
    return anomalies[0]


INPUT = [[0, 0, "a"], [0, 1, "b"], [1, 0, "c"]]
OUTPUT = [[0, 0, "a"], [1, 0, "b"], [1, 1, "c"]]


def test_a_clean_history_has_no_anomalies() -> None:
    events = [
        *_sent_and_acked(INPUT),
        _event("assign", "worker-0.0", topic="input", partitions=[0, 1]),
        _poll("worker-0.0", INPUT),
        _event("commit", "worker-0.0", topic="input", offsets=[[0, 2], [1, 1]]),
        *_final(INPUT, OUTPUT),
    ]
    result = check(events)
    assert result.anomalies == []
    assert (result.produced, result.acknowledged, result.delivered) == (3, 3, 3)


def test_an_acknowledged_value_missing_from_the_final_read_is_a_lost_write() -> None:
    events = [*_sent_and_acked([*INPUT, [1, 1, "d"]]), *_final(INPUT, OUTPUT)]
    lost = _only(check(events).anomalies, LOST_WRITE)
    assert lost.values == ["d"]
    assert lost.offsets == [("input", 1, 1)]
    assert check(events).lost == 1


def test_an_input_value_missing_from_the_output_is_lost_downstream() -> None:
    events = [*_sent_and_acked(INPUT), *_final(INPUT, OUTPUT[:2])]
    lost = _only(check(events).anomalies, LOST_DOWNSTREAM)
    assert lost.values == ["c"]
    assert lost.offsets == [("input", 1, 0)]


def test_one_value_at_two_offsets_is_a_duplicate() -> None:
    stored_twice = [*INPUT, [1, 1, "c"]]
    events = [*_sent_and_acked(INPUT), *_final(stored_twice, OUTPUT)]
    duplicate = _only(check(events).anomalies, DUPLICATE)
    assert duplicate.values == ["c"]
    assert duplicate.offsets == [("input", 1, 0), ("input", 1, 1)]


def test_a_value_delivered_twice_downstream_is_a_duplicate() -> None:
    events = [*_sent_and_acked(INPUT), *_final(INPUT, [*OUTPUT, [2, 0, "a"]])]
    duplicate = _only(check(events).anomalies, DUPLICATE)
    assert duplicate.values == ["a"]
    assert duplicate.offsets == [("output", 0, 0), ("output", 2, 0)]
    assert check(events).duplicated == 1


def test_a_read_committed_poll_of_an_aborted_record_is_an_aborted_read() -> None:
    # "x" sits at input 1/1 in a transaction its producer saw aborted.
    committed = [*INPUT, [1, 3, "d"]]
    events = [
        *_sent_and_acked(committed),
        *_transaction([[1, 1, "x"]], "aborted", process="producer-1.0"),
        _event("assign", "worker-0.0", topic="input", partitions=[1]),
        _poll("worker-0.0", [[1, 0, "c"], [1, 1, "x"], [1, 3, "d"]]),
        _read("input", committed),
        _read("input", [*INPUT, [1, 1, "x"], [1, 3, "d"]], "read_uncommitted"),
        _read("output", [*OUTPUT, [2, 0, "d"]]),
    ]
    aborted = _only(check(events).anomalies, ABORTED_READ)
    assert aborted.values == ["x"]
    assert aborted.offsets == [("input", 1, 1)]
    assert "worker-0.0" in aborted.detail


def test_a_broker_whose_reads_hide_its_aborted_records_is_caught_by_the_history() -> None:
    """The broker serves the aborted "x" to every read_committed reader, the final read too, so its
    own reads show no aborted record at all: the history still knows, and the cross-check says
    that the log disagrees with it."""
    served = [*INPUT, [1, 1, "x"]]
    events = [
        *_sent_and_acked(INPUT),
        *_transaction([[1, 1, "x"]], "aborted", process="producer-1.0"),
        _event("assign", "worker-0.0", topic="input", partitions=[0, 1]),
        _poll("worker-0.0", served),
        _read("input", served),
        _read("input", served, "read_uncommitted"),
        _read("output", [*OUTPUT, [2, 0, "x"]]),
    ]
    result = check(events)
    reads = {anomaly.detail for anomaly in result.of_kind(ABORTED_READ)}
    assert reads == {
        "worker-0.0 read a record of an aborted transaction with read_committed",
        "the final read_committed read returned a record of an aborted transaction",
        "aborted in the input, yet delivered to the output",
    }
    assert result.aborted_reads == 1  # one aborted record, read three times: counted once
    agreement = log_agreement(events)
    assert (agreement["agrees"], agreement["compared"], agreement["differ"]) == (False, 1, 1)
    assert agreement["examples"] == ["x at input partition 1 offset 1: aborted, the log says committed"]


def test_a_log_that_hides_a_committed_record_disagrees_with_the_history() -> None:
    """The history's commit of "y" was acknowledged; the broker's reads show it aborted (below the
    LSO, read_uncommitted only): a lost write, and the cross-check names the record."""
    events = [
        *_sent_and_acked(INPUT),
        *_transaction([[2, 0, "y"]], "committed", process="producer-1.0"),
        _read("input", [*INPUT, [2, 5, "z"]]),
        _read("input", [*INPUT, [2, 0, "y"], [2, 5, "z"]], "read_uncommitted"),
        _read("output", OUTPUT),
    ]
    lost = _only([a for a in check(events).anomalies if a.kind != "lost-downstream"], LOST_WRITE)
    assert lost.values == ["y"]
    agreement = log_agreement(events)
    assert (agreement["agrees"], agreement["differ"]) == (False, 1)
    assert agreement["examples"] == ["y at input partition 2 offset 0: committed, the log says aborted"]
    # The control: the log as the history says it should be.
    fine = [
        *events[:-3],
        _read("input", [*INPUT, [2, 0, "y"]]),
        _read("input", [*INPUT, [2, 0, "y"]], "read_uncommitted"),
    ]
    assert log_agreement(fine) == {"agrees": True, "compared": 1, "differ": 0, "examples": []}


def test_a_transaction_is_aborted_unless_its_client_asked_to_commit() -> None:
    """Killed before asking to commit: aborted, so reading it is an aborted read. Killed (or fenced)
    after asking: unknown, the commit may have landed, so reading it is no anomaly."""
    for outcome, commit_asked, found in (
        (None, False, 1),
        ("fenced", False, 1),
        (None, True, 0),
        ("fenced", True, 0),
    ):
        events = [
            *_sent_and_acked(INPUT),
            *_transaction([[1, 1, "x"]], outcome, commit_asked=commit_asked),
            _poll("worker-0.0", [[1, 0, "c"], [1, 1, "x"]]),
            *_final(INPUT, OUTPUT),
        ]
        assert check(events).aborted_reads == found, (outcome, commit_asked)


def test_an_aborted_input_value_delivered_to_the_output_is_an_aborted_read() -> None:
    events = [
        *_sent_and_acked(INPUT),
        *_transaction([[2, 0, "x"]], "aborted", process="producer-1.0"),
        _read("input", INPUT),
        _read("input", [*INPUT, [2, 0, "x"]], "read_uncommitted"),
        _read("output", [*OUTPUT, [2, 0, "x"]]),
    ]
    aborted = _only(check(events).anomalies, ABORTED_READ)
    assert aborted.values == ["x"]
    assert aborted.offsets == [("input", 2, 0)]


def test_a_value_aborted_once_and_committed_when_sent_again_may_be_delivered() -> None:
    """A restarted transactional producer sends again what its aborted transaction held."""
    events = [
        *_transaction([[0, 0, "a"]], None, commit_asked=False),
        *_transaction([[0, 2, "a"]], "committed", process="producer-0.1"),
        _read("input", [[0, 2, "a"]]),
        _read("input", [[0, 0, "a"], [0, 2, "a"]], "read_uncommitted"),
        _read("output", [[0, 0, "a"]]),
    ]
    assert check(events).anomalies == []


def test_one_offset_with_two_values_is_inconsistent() -> None:
    events = [
        *_sent_and_acked(INPUT),
        _event("ack", "producer-1.0", topic="input", value="z", partition=0, offset=1),
        *_final(INPUT, OUTPUT),
    ]
    anomalies = check(events).anomalies
    inconsistent = [anomaly for anomaly in anomalies if anomaly.kind == INCONSISTENT_OFFSET]
    assert len(inconsistent) == 1
    assert inconsistent[0].values == ["b", "z"]
    assert inconsistent[0].offsets == [("input", 0, 1)]
    # "z" was acknowledged and is nowhere: also a lost write, at the offset its ack claimed.
    assert [(a.kind, a.values) for a in anomalies if a.kind != INCONSISTENT_OFFSET] == [(LOST_WRITE, ["z"])]


def test_a_consumer_going_back_without_a_new_assignment_is_non_monotonic() -> None:
    events = [
        *_sent_and_acked(INPUT),
        _event("assign", "worker-0.0", topic="input", partitions=[0]),
        _poll("worker-0.0", [[0, 0, "a"], [0, 1, "b"]]),
        _poll("worker-0.0", [[0, 1, "b"]]),
        *_final(INPUT, OUTPUT),
    ]
    anomaly = _only(check(events).anomalies, NON_MONOTONIC_POLL)
    assert anomaly.values == ["b", "b"]
    assert anomaly.offsets == [("input", 0, 1), ("input", 0, 1)]


def test_going_back_after_a_new_assignment_is_allowed() -> None:
    events = [
        *_sent_and_acked(INPUT),
        _event("assign", "worker-0.0", topic="input", partitions=[0]),
        _poll("worker-0.0", [[0, 0, "a"], [0, 1, "b"]]),
        _event("assign", "worker-0.0", topic="input", partitions=[0, 1]),
        _poll("worker-0.0", [[0, 1, "b"], [1, 0, "c"]]),
        *_final(INPUT, OUTPUT),
    ]
    assert check(events).anomalies == []


def test_a_consumer_jumping_over_a_present_offset_is_skipping() -> None:
    records = [[0, 0, "a"], [0, 1, "b"], [0, 2, "c"]]
    events = [
        *_sent_and_acked(records),
        _poll("worker-0.0", [[0, 0, "a"], [0, 2, "c"]]),
        *_final(records, [[1, 0, "a"], [1, 1, "b"], [1, 2, "c"]]),
    ]
    skip = _only(check(events).anomalies, SKIPPING_POLL)
    assert skip.values == ["a", "c"]
    assert skip.offsets == [("input", 0, 0), ("input", 0, 1), ("input", 0, 2)]


def test_gaps_of_transaction_markers_are_not_skips() -> None:
    # Offsets 1 and 3 hold commit markers: they are in no read, so jumping over them is fine.
    records = [[0, 0, "a"], [0, 2, "b"], [0, 4, "c"]]
    events = [
        *_sent_and_acked(records),
        _poll("worker-0.0", records),
        *_final(records, [[1, 0, "a"], [1, 1, "b"], [1, 2, "c"]]),
    ]
    assert check(events).anomalies == []


def test_the_history_survives_a_torn_last_line(tmp_path: Any) -> None:
    writer = HistoryWriter(tmp_path / "producer-0.0.jsonl", "producer-0.0")
    writer.record("send", topic="input", value="a")
    writer.close()
    with (tmp_path / "producer-0.0.jsonl").open("a") as torn:
        torn.write('{"time": 1.0, "process": "produ')
    events = read_history(tmp_path)
    assert [(event["type"], event["value"]) for event in events] == [("send", "a")]


@st.composite
def _clean_histories(draw: st.DrawFn) -> list[Event]:
    """Random runs of a correct system: unique values, gaps for markers, polls in order, some
    consumers restarting from earlier offsets after a new assignment, aborted records unread."""
    events: list[Event] = []
    committed: list[Record] = []
    uncommitted: list[Record] = []
    number = 0
    for partition in range(draw(st.integers(1, 3))):
        offset = 0
        for _ in range(draw(st.integers(0, 12))):
            offset += draw(st.integers(1, 3))  # gaps: markers, or aborted records
            value = f"v{number}"
            number += 1
            if draw(st.booleans()) and draw(st.booleans()):
                uncommitted.append([partition, offset, value])  # aborted, never acknowledged
                events += _transaction([[partition, offset, value]], draw(st.sampled_from(["aborted", None])),
                                       process="producer-1.0", commit_asked=False)  # fmt: skip
                continue
            committed.append([partition, offset, value])
            uncommitted.append([partition, offset, value])
            events.append(_event("send", "producer-0.0", topic="input", value=value))
            if draw(st.booleans()):
                events.append(
                    _event(
                        "ack", "producer-0.0", topic="input", value=value, partition=partition, offset=offset
                    )
                )
    partitions = sorted({record[0] for record in committed})
    for consumer in range(draw(st.integers(1, 2))):
        process = f"worker-{consumer}.0"
        for _round in range(draw(st.integers(1, 2))):
            events.append(_event("assign", process, topic="input", partitions=partitions))
            for partition in partitions:
                mine = [record for record in committed if record[0] == partition]
                start = draw(st.integers(0, len(mine)))
                events.append(_poll(process, mine[start:]))
    output = [[index % 2, index // 2, record[2]] for index, record in enumerate(committed)]
    events += [
        _read("input", committed),
        _read("input", uncommitted, "read_uncommitted"),
        _read("output", output),
        _read("output", output, "read_uncommitted"),
    ]
    return events


@settings(max_examples=150, deadline=None)
@given(_clean_histories())
def test_random_clean_histories_have_no_anomalies(events: list[Event]) -> None:
    assert check(events).anomalies == []
