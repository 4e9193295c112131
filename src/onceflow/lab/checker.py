"""The checker, after Jepsen's Kafka workload: it judges a history of sends, acks, polls, commits
and final reads, and reports every anomaly with the values and offsets involved.

Event types it reads (see `history.py`; every event also has `time`, `process` and `type`):
- `send` {topic, value} and `ack` {topic, value, partition, offset|None} of producers, and
  `unhandled-ack` {topic, value, partition, offset}: an ack the producer died before handling;
- `written`, `commit-txn` and `txn` of transactional clients (`transactions.py`): which records
  were aborted is decided from these, as the clients saw their transactions end, never from the
  broker under test;
- `assign` {topic, partitions} and `poll` {topic, isolation, records: [[partition, offset, value]]}
  of consumers;
- `read` {topic, isolation, records, ends: [[partition, end offset]]}: the final read of a topic
  from offset 0 to its end (the LSO for read_committed).

The broker's own view of its aborted records (read_uncommitted below the LSO minus read_committed)
is only a cross-check, reported beside the verdicts (`log_agreement`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from onceflow.lab.history import Event
from onceflow.lab.transactions import ABORTED, COMMITTED, Fates, fates

Position = tuple[str, int, int]  # topic, partition, offset

LOST_WRITE = "lost-write"
LOST_DOWNSTREAM = "lost-downstream"
DUPLICATE = "duplicate"
ABORTED_READ = "aborted-read"
INCONSISTENT_OFFSET = "inconsistent-offset"
NON_MONOTONIC_POLL = "non-monotonic-poll"
SKIPPING_POLL = "skipping-poll"
KINDS = (
    LOST_WRITE,
    LOST_DOWNSTREAM,
    DUPLICATE,
    ABORTED_READ,
    INCONSISTENT_OFFSET,
    NON_MONOTONIC_POLL,
    SKIPPING_POLL,
)


@dataclass(frozen=True)
class Anomaly:
    kind: str
    values: list[str]
    offsets: list[Position]
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "values": self.values,
            "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in self.offsets],
            "detail": self.detail,
        }


@dataclass
class CheckResult:
    produced: int
    acknowledged: int
    delivered: int
    anomalies: list[Anomaly] = field(default_factory=list)

    def of_kind(self, *kinds: str) -> list[Anomaly]:
        return [anomaly for anomaly in self.anomalies if anomaly.kind in kinds]

    @property
    def lost(self) -> int:
        return len(self.of_kind(LOST_WRITE, LOST_DOWNSTREAM))

    @property
    def duplicated(self) -> int:
        return len({value for anomaly in self.of_kind(DUPLICATE) for value in anomaly.values})

    @property
    def aborted_reads(self) -> int:
        """Distinct values of aborted transactions that reached a read_committed reader or the output."""
        return len({value for anomaly in self.of_kind(ABORTED_READ) for value in anomaly.values})


class FinalRead:
    """The records of one topic in its final reads, by isolation level."""

    def __init__(self) -> None:
        self.records: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        self.ends: dict[str, dict[int, int]] = defaultdict(dict)

    def positions(self, isolation: str) -> dict[str, list[tuple[int, int]]]:
        by_value: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for partition, offset, value in self.records[isolation]:
            by_value[value].append((partition, offset))
        return by_value

    def offsets(self, isolation: str) -> dict[int, list[int]]:
        """Sorted offsets per partition: what a consumer at that level could have read."""
        per_partition: dict[int, set[int]] = defaultdict(set)
        for partition, offset, _value in self.records[isolation]:
            per_partition[partition].add(offset)
        return {partition: sorted(offsets) for partition, offsets in per_partition.items()}

    def aborted(self) -> dict[tuple[int, int], str]:
        """Records a read_uncommitted read returned below the LSO that read_committed skipped: the
        broker's view of its aborted records, for the cross-check only."""
        committed = {(p, o) for p, o, _v in self.records["read_committed"]}
        ends = self.ends["read_committed"]
        return {
            (p, o): v
            for p, o, v in self.records["read_uncommitted"]
            if (p, o) not in committed and o < ends.get(p, 1 << 62)
        }


def final_reads(events: Iterable[Event]) -> defaultdict[str, FinalRead]:
    """The final reads of each topic in a history."""
    reads: defaultdict[str, FinalRead] = defaultdict(FinalRead)
    for event in events:
        if event["type"] == "read":
            final = reads[event["topic"]]
            final.records[event["isolation"]] += [(p, o, v) for p, o, v in event["records"]]
            final.ends[event["isolation"]].update({p: end for p, end in event.get("ends", [])})
    return reads


def check(events: Iterable[Event], input_topic: str = "input", output_topic: str = "output") -> CheckResult:
    events = list(events)
    reads = final_reads(events)
    transactions = fates(events)
    sent = {e["value"] for e in events if e["type"] == "send" and e["topic"] == input_topic}
    acks = {e["value"]: e for e in events if e["type"] == "ack" and e["topic"] == input_topic}
    committed_in = reads[input_topic].positions("read_committed")
    committed_out = reads[output_topic].positions("read_committed") if output_topic in reads else None

    anomalies = _lost(input_topic, acks, committed_in, committed_out)
    for topic in (input_topic, output_topic):
        if topic in reads:
            anomalies += _duplicates(topic, reads[topic].positions("read_committed"))
    anomalies += _aborted_reads(events, transactions, input_topic, committed_out)
    anomalies += _inconsistent_offsets(events)
    anomalies += _poll_order(events, reads, transactions)
    delivered = committed_out if committed_out is not None else committed_in
    return CheckResult(
        produced=len(sent), acknowledged=len(acks), delivered=len(delivered), anomalies=anomalies
    )


def _lost(
    topic: str,
    acks: dict[str, Event],
    committed_in: dict[str, list[tuple[int, int]]],
    committed_out: dict[str, list[tuple[int, int]]] | None,
) -> list[Anomaly]:
    anomalies = []
    for value, ack in acks.items():
        if value not in committed_in:
            at = [(topic, ack["partition"], ack["offset"])] if ack.get("offset") is not None else []
            anomalies.append(
                Anomaly(LOST_WRITE, [value], at, "acknowledged, but not in the final read_committed read")
            )
    if committed_out is not None:
        for value, positions in committed_in.items():
            if value not in committed_out:
                at = [(topic, p, o) for p, o in positions]
                anomalies.append(
                    Anomaly(LOST_DOWNSTREAM, [value], at, "in the input, but never delivered to the output")
                )
    return anomalies


def _duplicates(topic: str, committed: dict[str, list[tuple[int, int]]]) -> list[Anomaly]:
    return [
        Anomaly(
            DUPLICATE,
            [value],
            [(topic, p, o) for p, o in positions],
            f"stored {len(positions)} times in {topic}",
        )
        for value, positions in committed.items()
        if len(positions) > 1
    ]


def _aborted_reads(
    events: list[Event],
    transactions: Fates,
    input_topic: str,
    committed_out: dict[str, list[tuple[int, int]]] | None,
) -> list[Anomaly]:
    """Records the history shows aborted, read with read_committed (by a worker's poll or the final
    read) or passed on to the output."""
    anomalies = []
    for event in events:
        if event["type"] in ("poll", "read") and event["isolation"] == "read_committed":
            topic = event["topic"]
            aborted = transactions.aborted(topic)
            detail = (
                f"{event['process']} read a record of an aborted transaction with read_committed"
                if event["type"] == "poll"
                else "the final read_committed read returned a record of an aborted transaction"
            )
            for p, o, v in event["records"]:
                if aborted.get((p, o)) == v:
                    anomalies.append(Anomaly(ABORTED_READ, [v], [(topic, p, o)], detail))
    if committed_out is not None:
        positions = {value: position for position, value in transactions.aborted(input_topic).items()}
        for value in sorted(transactions.only_aborted_values(input_topic) & committed_out.keys()):
            at = [(input_topic, *positions[value])] if value in positions else []
            detail = "aborted in the input, yet delivered to the output"
            anomalies.append(Anomaly(ABORTED_READ, [value], at, detail))
    return anomalies


def log_agreement(events: Iterable[Event]) -> dict[str, Any]:
    """The cross-check: whether the broker's own view of which records were aborted (its final
    reads: read_uncommitted below the LSO, skipped by read_committed) matches the history's, on the
    records the history knows the fate of. Never a verdict's source."""
    events = list(events)
    transactions = fates(events)
    compared, differing = 0, []
    for topic, final in sorted(final_reads(events).items()):
        in_log = {(p, o): v for p, o, v in final.records["read_uncommitted"]}
        aborted_in_log = final.aborted()
        ends = final.ends["read_committed"]
        known = ((ABORTED, transactions.aborted(topic)), (COMMITTED, transactions.committed(topic)))
        for fate, positions in known:
            for (p, o), value in sorted(positions.items()):
                if o >= ends.get(p, 0) or in_log.get((p, o)) != value:
                    continue  # past the LSO (not yet decided in the log), or not there at all
                compared += 1
                if ((p, o) in aborted_in_log) != (fate == ABORTED):
                    shown = "aborted" if (p, o) in aborted_in_log else "committed"
                    where = f"{topic} partition {p} offset {o}"
                    differing.append(f"{value} at {where}: {fate}, the log says {shown}")
    return {
        "agrees": not differing,
        "compared": compared,
        "differ": len(differing),
        "examples": differing[:5],
    }


def _inconsistent_offsets(events: list[Event]) -> list[Anomaly]:
    seen: dict[Position, set[str]] = defaultdict(set)
    for event in events:
        if event["type"] in ("ack", "written", "unhandled-ack") and event.get("offset") is not None:
            seen[(event["topic"], event["partition"], event["offset"])].add(event["value"])
        elif event["type"] in ("poll", "read"):
            for p, o, v in event["records"]:
                seen[(event["topic"], p, o)].add(v)
    return [
        Anomaly(INCONSISTENT_OFFSET, sorted(values), [position], "one offset holds different values")
        for position, values in sorted(seen.items())
        if len(values) > 1
    ]


def _poll_order(events: list[Event], reads: dict[str, FinalRead], transactions: Fates) -> list[Anomaly]:
    """Within one consumer, each partition's polls must advance and skip nothing its isolation level
    could read (for read_committed: what the final read returned, less what the history shows
    aborted); an assignment restarts the partitions from their committed offsets."""
    anomalies = []
    present = {
        (topic, isolation): final.offsets(isolation)
        for topic, final in reads.items()
        for isolation in ("read_committed", "read_uncommitted")
    }
    for topic in reads:
        aborted = transactions.aborted(topic)
        committed = present[(topic, "read_committed")]
        present[(topic, "read_committed")] = {
            p: [o for o in offsets if (p, o) not in aborted] for p, offsets in committed.items()
        }
    last: dict[tuple[str, str, int], tuple[int, str]] = {}
    for event in events:
        process, topic = event["process"], event.get("topic", "")
        if event["type"] == "assign":
            for key in [key for key in last if key[:2] == (process, topic)]:
                del last[key]
        if event["type"] != "poll":
            continue
        offsets = present.get((topic, event["isolation"])) or present.get((topic, "read_committed"), {})
        for p, o, v in event["records"]:
            previous = last.get((process, topic, p))
            last[(process, topic, p)] = (o, v)
            if previous is None:
                continue
            before, before_value = previous
            if o <= before:
                anomalies.append(
                    Anomaly(
                        NON_MONOTONIC_POLL,
                        [before_value, v],
                        [(topic, p, before), (topic, p, o)],
                        f"{process} polled offset {o} after {before}",
                    )
                )
                continue
            row = offsets.get(p, [])
            skipped = row[bisect.bisect_right(row, before) : bisect.bisect_left(row, o)]
            if skipped:
                anomalies.append(
                    Anomaly(
                        SKIPPING_POLL,
                        [before_value, v],
                        [(topic, p, before), *((topic, p, s) for s in skipped), (topic, p, o)],
                        f"{process} jumped from offset {before} to {o} over {len(skipped)} record(s)",
                    )
                )
    return anomalies
