"""Negative controls: a broker fault (`faults/proxy.py`) makes the broker break one rule, and the
checker must report it. Each run under a broker fault says whether the fault was caught:
- `serve-aborted` serves aborted records to read_committed readers, the final reads too (as a
  broker whose isolation is broken would): caught when the run reports aborted reads, which it can
  only find from the history, since the broker's own reads now hide its aborted records;
- `drop-acked-produce` acknowledges Produce requests it never forwards: caught when every value
  the fault dropped that a producer saw acknowledged is reported lost;
- `duplicate-produce` stores a Produce request twice, the copy stripped of what idempotence needs:
  caught when every value it copied is reported duplicated.
A fault that did not hit what the guarantee's clients do (no read_committed reader, no transaction
to abort, no request it could drop or copy) is "not applicable" to that run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

CAUGHT, MISSED, NOT_APPLICABLE = "caught", "MISSED", "not applicable"
EXPECTED = {
    "serve-aborted": "aborted reads",
    "drop-acked-produce": "lost writes",
    "duplicate-produce": "duplicates",
}


def judge(run: Mapping[str, Any], acknowledged: Collection[str]) -> dict[str, Any] | None:
    """Whether the run's broker fault was caught, with what it did and what the checker found;
    None without a broker fault. `acknowledged`: the values the run's producers saw acknowledged."""
    fault = run.get("broker_fault")
    if fault is None:
        return None
    effects = run.get("broker_fault_effects") or {}
    anomalies = run["anomalies"]
    if fault == "serve-aborted":
        hit = run["coverage"].get("aborted_records", 0) if effects.get("fetches_rewritten") else 0
        did = f"{effects.get('fetches_rewritten', 0)} read_committed Fetch requests sent as read_uncommitted"
        found = {value for a in anomalies if a["kind"] == "aborted-read" for value in a["values"]}
        why = "no aborted transaction for a read_committed reader to see" if not hit else ""
        caught = bool(found)
        shown = f"{len(found)} aborted records read, of {hit} aborted records read past"
    else:
        kinds = ("lost-write", "lost-downstream") if fault == "drop-acked-produce" else ("duplicate",)
        key = "dropped_values" if fault == "drop-acked-produce" else "duplicated_values"
        touched = set(effects.get(key, []))
        if fault == "drop-acked-produce":
            touched &= set(acknowledged)  # a dropped send whose transaction aborted lost nothing
        found = {value for a in anomalies if a["kind"] in kinds for value in a["values"]}
        hit = len(touched)
        verb = "acknowledged and dropped" if fault == "drop-acked-produce" else "stored twice"
        did = f"{hit} values {verb}"
        why = "no request the fault could hit (it spares transactional and acks=0 ones)" if not hit else ""
        caught = touched <= found
        shown = f"{len(touched & found)} of those {hit} reported, {len(found)} in all"
    verdict = NOT_APPLICABLE if not hit else CAUGHT if caught else MISSED
    return {
        "fault": fault,
        "expected": EXPECTED[fault],
        "did": did,
        "found": shown,
        "verdict": verdict,
        "why_not_applicable": why or None,
    }


def line(control: Mapping[str, Any]) -> str:
    """One line, e.g. "serve-aborted: expected aborted reads: caught (...)"."""
    if control["verdict"] == NOT_APPLICABLE:
        return f"broker fault {control['fault']}: not applicable ({control['why_not_applicable']})"
    return (
        f"broker fault {control['fault']}: expected: caught — {control['verdict']}"
        f" ({control['expected']}; the fault: {control['did']}; the checker: {control['found']})"
    )
