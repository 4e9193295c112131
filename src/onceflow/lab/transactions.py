"""What a run's history says of each transactional write: committed, aborted or unknown.

The history is the oracle: a record's fate comes from what its client saw, never from the broker
under test. A transactional client records
- `written` {topic, value, partition, offset}: the broker acknowledged a send of its open
  transaction at that offset (offset None when the answer named none);
- `commit-txn` {topic}: it is about to ask the coordinator to commit;
- `txn` {topic, outcome, values}: the answer it got: `committed`, `aborted` (it had asked to
  abort), `fenced`, or `unknown` (any other error).

A transaction is a process's `written` events since its previous `txn`. Its fate:
- committed: the commit was acknowledged;
- aborted: the abort was acknowledged, or the client never asked to commit (it was killed,
  paused or fenced first, or stopped by the lab): a transaction commits only on its client's
  EndTxn(commit), so read_committed readers must never see its records;
- unknown: the client asked to commit and saw no success (killed while waiting, fenced, an error):
  an earlier attempt of the same EndTxn may have landed, so the history claims nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from onceflow.lab.history import Event

COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"
# The outcomes a client records in `txn` events.
OUTCOMES = (COMMITTED, ABORTED, "fenced", UNKNOWN)
Positions = dict[tuple[int, int], str]  # (partition, offset) -> value


@dataclass
class Fates:
    """Per fate, per topic, the positions of the transactional writes whose offset is known, and
    the values of all of them (offsets or not)."""

    positions: dict[str, defaultdict[str, Positions]] = field(
        default_factory=lambda: {fate: defaultdict(dict) for fate in (COMMITTED, ABORTED, UNKNOWN)}
    )
    values: dict[str, defaultdict[str, set[str]]] = field(
        default_factory=lambda: {fate: defaultdict(set) for fate in (COMMITTED, ABORTED, UNKNOWN)}
    )

    def aborted(self, topic: str) -> Positions:
        return self.positions[ABORTED].get(topic, {})

    def committed(self, topic: str) -> Positions:
        return self.positions[COMMITTED].get(topic, {})

    def only_aborted_values(self, topic: str) -> set[str]:
        """Values every transactional write of which was aborted: no reader may ever see them."""
        return (
            self.values[ABORTED].get(topic, set())
            - self.values[COMMITTED].get(topic, set())
            - self.values[UNKNOWN].get(topic, set())
        )

    def settle(self, writes: Iterable[Event], fate: str) -> None:
        for write in writes:
            topic, value = write["topic"], str(write["value"])
            self.values[fate][topic].add(value)
            if write.get("offset") is not None:
                self.positions[fate][topic][(write["partition"], write["offset"])] = value


def fates(events: Iterable[Event]) -> Fates:
    """The fate of every transactional write in a history (see the module's docstring)."""
    by_process: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        if event["type"] in ("written", "commit-txn", "txn"):
            by_process[event["process"]].append(event)
    found = Fates()
    for history in by_process.values():
        open_writes: list[Event] = []
        commit_asked = False
        for event in history:
            if event["type"] == "written":
                open_writes.append(event)
            elif event["type"] == "commit-txn":
                commit_asked = True
            else:
                if event["outcome"] == COMMITTED:
                    fate = COMMITTED
                elif event["outcome"] == ABORTED or not commit_asked:
                    fate = ABORTED
                else:
                    fate = UNKNOWN
                found.settle(open_writes, fate)
                open_writes, commit_asked = [], False
        # The process ended with its transaction open.
        found.settle(open_writes, UNKNOWN if commit_asked else ABORTED)
    return found


def outcomes(events: Iterable[Event]) -> dict[str, int]:
    """How many transactions ended each way as their clients saw it (`OUTCOMES`), and how many
    were left open by a client that died or was stopped (`left open`): evidence of the mechanism."""
    counts = dict.fromkeys((*OUTCOMES, "left open"), 0)
    open_by_process: dict[str, bool] = {}
    for event in events:
        if event["type"] == "written":
            open_by_process[event["process"]] = True
        elif event["type"] == "txn":
            counts[event["outcome"]] += 1
            open_by_process[event["process"]] = False
    counts["left open"] = sum(open_by_process.values())
    return counts
