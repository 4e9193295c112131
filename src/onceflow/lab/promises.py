"""What each guarantee promises under a set of faults, per anomaly: "never" (a promise the
measurement must keep: 0) or "may" (any count).

At-most-once may lose and never duplicates, at-least-once never loses and may duplicate,
exactly-once neither loses, duplicates nor reads aborted data. The idempotent producer is the
documents' formula, at-least-once + idempotence = exactly-once per partition within one producer
session: its runs have producers only, and it never loses and never duplicates unless a fault
starts a new producer session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MAY, NEVER = "may", "never"
ANOMALIES = ("lost", "duplicated", "aborted_reads")
# Aborted reads matter only to read_committed readers: the other presets promise nothing of them.
PREDICTIONS: dict[str, dict[str, str]] = {
    "at-most-once": {"lost": MAY, "duplicated": NEVER},
    "at-least-once": {"lost": NEVER, "duplicated": MAY},
    "idempotent": {"lost": NEVER, "duplicated": NEVER},
    "exactly-once": {"lost": NEVER, "duplicated": NEVER, "aborted_reads": NEVER},
}
# The faults past the idempotent producer's promise, and why.
BEYOND_ONE_SESSION = {
    "producer-crash": "a restarted producer is a new session: a new producer id, whose sends"
    " the broker cannot tell from its predecessor's",
}
PROMISES = {
    "lost": "never loses an acknowledged write",
    "duplicated": "never stores a value twice",
    "aborted_reads": "never reads aborted data",
}


def predict(guarantee: str, faults: Iterable[str]) -> dict[str, str]:
    """The prediction per anomaly of `guarantee` under `faults`."""
    predicted = dict(PREDICTIONS[guarantee])
    if guarantee == "idempotent" and set(faults) & BEYOND_ONE_SESSION.keys():
        predicted["duplicated"] = MAY
    return predicted


def why_may(guarantee: str, faults: Iterable[str]) -> str | None:
    """Why the idempotent producer's "never" turned into "may" under `faults`, if it did."""
    if guarantee != "idempotent":
        return None
    reasons = [reason for fault, reason in BEYOND_ONE_SESSION.items() if fault in set(faults)]
    return "; ".join(reasons) or None


def broken(run: Mapping[str, Any]) -> list[str]:
    """The promises a run (in the reports' shape) breaks, as sentences."""
    predicted = predict(run["guarantee"], run["faults"])
    return [
        f"{run['guarantee']} {PROMISES[anomaly]}, yet {anomaly.replace('_', ' ')}: {run[anomaly]}"
        for anomaly, prediction in predicted.items()
        if prediction == NEVER and run[anomaly]
    ]
