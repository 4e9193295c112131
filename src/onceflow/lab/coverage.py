"""Coverage: how often a run created the precondition of each anomaly the checker looks for.

A check that found nothing proves something only if the run gave it a chance to fail: "0 aborted
reads" means nothing when no aborted transaction ever reached the log. Every count comes from what
happened, not from what the schedule meant to happen, and none from the broker under test's
isolation logic:
- `aborted_records`: records of the input topic in transactions the history shows aborted
  (`transactions.py`), at offsets the broker acknowledged, that read_committed consumers read past
  (a poll of theirs returned that offset or a later one of its partition);
- `acks_lost`: responses to writes (Produce, OffsetCommit, TxnOffsetCommit, EndTxn) the proxy
  destroyed after the broker had acted on them, or that were still due on a connection the proxy
  reset;
- `produce_requests_lost`: Produce requests the proxy destroyed before the broker saw them (a
  fire-and-forget send among them is lost without anyone knowing);
- `broker_kills`: SIGKILLs of the broker;
- `producers_killed_mid_batch`: producer incarnations that died with their last send neither
  acknowledged nor aborted;
- `resent_by_new_session`: values a restarted producer (a new producer session: a new producer id
  unless a transactional id carries it over) sent again after the broker had stored them for its
  predecessor (`written`, or an `unhandled-ack`);
- `consumers_killed_before_commit`: worker incarnations that died with polled records they had
  not committed (so they are read again);
- `consumers_killed_before_output`: worker incarnations that died with committed records they had
  not processed;
- `zombies_resumed`: worker incarnations paused with polled records uncommitted (and, where the
  preset processes first, processed), that went on after their successor had started: a zombie
  whose commit only fencing can stop.
A run's last incarnation of each client is left out: the lab stops it after the drain.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from onceflow.lab.checker import CheckResult
from onceflow.lab.history import Event
from onceflow.lab.transactions import fates

COUNTERS = (
    "aborted_records",
    "acks_lost",
    "produce_requests_lost",
    "broker_kills",
    "producers_killed_mid_batch",
    "resent_by_new_session",
    "consumers_killed_before_commit",
    "consumers_killed_before_output",
    "zombies_resumed",
)
# The anomalies a run is judged on, each with the counters that give it a chance to show.
PRECONDITIONS: dict[str, tuple[str, ...]] = {
    "lost": (
        "acks_lost",
        "produce_requests_lost",
        "broker_kills",
        "producers_killed_mid_batch",
        "consumers_killed_before_commit",
        "consumers_killed_before_output",
    ),
    "duplicated": (
        "acks_lost",
        "broker_kills",
        "resent_by_new_session",
        "consumers_killed_before_commit",
        "zombies_resumed",
    ),
    # Only read_committed workers can read an aborted record they should not have.
    "aborted_reads": ("aborted_records",),
}
FOUND, CLEAN, NOT_TESTED = "found", "clean", "not tested"


def measure(
    events: Iterable[Event],
    input_topic: str,
    acks_lost: int,
    broker_kills: int,
    produce_requests_lost: int = 0,
) -> dict[str, int]:
    """The coverage counters of one run (see the module's docstring)."""
    events = list(events)
    counts = dict.fromkeys(COUNTERS, 0)
    counts["acks_lost"] = acks_lost
    counts["broker_kills"] = broker_kills
    counts["produce_requests_lost"] = produce_requests_lost
    counts["aborted_records"] = _aborted_records_read_past(events, input_topic)
    counts["resent_by_new_session"] = _resent_by_new_session(events)
    by_process: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        by_process[event["process"]].append(event)
    last_incarnation: dict[str, int] = {}
    for process in by_process:
        name, _, incarnation = process.partition(".")
        if incarnation.isdigit():
            last_incarnation[name] = max(last_incarnation.get(name, -1), int(incarnation))
    for process, history in by_process.items():
        name, _, incarnation = process.partition(".")
        if not incarnation.isdigit() or int(incarnation) == last_incarnation[name]:
            continue
        if name.startswith("producer") and _killed_mid_batch(history):
            counts["producers_killed_mid_batch"] += 1
        elif name.startswith("worker") and any(event["type"] == "resume" for event in history):
            counts["zombies_resumed"] += 1
        elif name.startswith("worker"):
            after_poll = _after_last(history, "poll")
            if after_poll is None:
                continue
            kinds = {event["type"] for event in after_poll}
            if "commit" not in kinds:
                counts["consumers_killed_before_commit"] += 1
            elif "processed" not in kinds:
                counts["consumers_killed_before_output"] += 1
    return counts


def _aborted_records_read_past(events: list[Event], topic: str) -> int:
    furthest: dict[int, int] = {}
    for event in events:
        if event["type"] == "poll" and event["topic"] == topic and event["isolation"] == "read_committed":
            for partition, offset, _value in event["records"]:
                furthest[partition] = max(furthest.get(partition, -1), offset)
    aborted = fates(events).aborted(topic)
    return sum(1 for partition, offset in aborted if offset <= furthest.get(partition, -1))


def _resent_by_new_session(events: list[Event]) -> int:
    """Values a producer incarnation sent that the broker had stored for an earlier one."""
    stored: dict[tuple[str, str], int] = {}  # (producer, value) -> the incarnation it was stored for
    resent = set()
    for event in sorted(events, key=lambda event: _incarnation(event["process"])):
        name, incarnation = event["process"].partition(".")[0], _incarnation(event["process"])
        if not name.startswith("producer"):
            continue
        key = (name, str(event.get("value")))
        if event["type"] in ("written", "unhandled-ack"):
            stored.setdefault(key, incarnation)
        elif event["type"] == "send" and stored.get(key, incarnation) < incarnation:
            resent.add(key)
    return len(resent)


def _incarnation(process: str) -> int:
    incarnation = process.partition(".")[2]
    return int(incarnation) if incarnation.isdigit() else -1


def _after_last(history: list[Event], kind: str) -> list[Event] | None:
    """The events after the last one of `kind`, or None when there is none."""
    for index in range(len(history) - 1, -1, -1):
        if history[index]["type"] == kind:
            return history[index + 1 :]
    return None


def _killed_mid_batch(history: list[Event]) -> bool:
    sends = [event["value"] for event in history if event["type"] == "send"]
    if not sends:
        return False
    settled = {event["value"] for event in history if event["type"] in ("ack", "fail")}
    settled |= {value for event in history if event["type"] == "txn" for value in event["values"]}
    return sends[-1] not in settled


def verdicts(result: CheckResult, coverage: dict[str, int], read_committed: bool) -> dict[str, str]:
    """Per anomaly: found, clean (looked for with its preconditions present) or not tested."""
    found = {"lost": result.lost, "duplicated": result.duplicated, "aborted_reads": result.aborted_reads}
    judged = {}
    for anomaly, counters in PRECONDITIONS.items():
        if anomaly == "aborted_reads" and not read_committed and not found[anomaly]:
            continue
        if found[anomaly]:
            judged[anomaly] = FOUND
        else:
            judged[anomaly] = CLEAN if any(coverage[counter] for counter in counters) else NOT_TESTED
    return judged
