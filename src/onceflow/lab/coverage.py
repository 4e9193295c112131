"""Coverage: how often a run created the precondition of each anomaly the checker looks for.

A check that found nothing proves something only if the run gave it a chance to fail: "0 aborted
reads" means nothing when no aborted transaction ever reached the log. Every count comes from what
happened, not from what the schedule meant to happen:
- `aborted_records_in_log`: records of the input topic a read_uncommitted read returns below the
  LSO and a read_committed read skips, i.e. records of aborted transactions, from the final reads
  of the log itself;
- `acks_lost`: responses to writes (Produce, OffsetCommit, TxnOffsetCommit, EndTxn) the proxy
  destroyed after the broker had acted on them, or that were still due on a connection the proxy
  reset;
- `produce_requests_lost`: Produce requests the proxy destroyed before the broker saw them (a
  fire-and-forget send among them is lost without anyone knowing);
- `broker_kills`: SIGKILLs of the broker;
- `producers_killed_mid_batch`: producer incarnations that died with their last send neither
  acknowledged nor aborted;
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

from onceflow.lab.checker import CheckResult, final_reads
from onceflow.lab.history import Event

COUNTERS = (
    "aborted_records_in_log",
    "acks_lost",
    "produce_requests_lost",
    "broker_kills",
    "producers_killed_mid_batch",
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
    "duplicated": ("acks_lost", "broker_kills", "consumers_killed_before_commit", "zombies_resumed"),
    # Only read_committed workers can read an aborted record they should not have.
    "aborted_reads": ("aborted_records_in_log",),
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
    reads = final_reads(events)
    if input_topic in reads:
        counts["aborted_records_in_log"] = len(reads[input_topic].aborted())
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
    settled |= {value for event in history if event["type"] == "abort" for value in event["values"]}
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
