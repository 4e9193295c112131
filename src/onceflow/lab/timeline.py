"""What the report draws from a run's history: the clients' lives, the faults as bands, throughput
and ack latency over time, and the operations around each anomaly.

The runner writes its faults into the history too (process `lab`, type `fault`, with an `action`
from `faults.FaultEvent`), so that a band starts when the fault did, not when it was planned.
Times are seconds since the run's first event.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from onceflow.lab import faults
from onceflow.lab.history import Event

LAB_PROCESS = "lab"
FINAL_READ = "final-read"
BUCKETS = 40
MIN_BUCKET_S = 0.25
KILL_BAND_S = 1.0  # a kill whose client never came back is drawn this wide
CONTEXT = 3  # operations shown before and after those that touch an anomaly's values
MAX_CONTEXT = 14
# The band a fault draws: from its action to the matching end action (None: see `_bands`).
BAND_ENDS = {
    "lose-acks": ("lost acks", "stop-losing-acks"),
    "lose-requests": ("lost requests", "stop-losing-requests"),
    "kill-broker": ("broker killed", "restart-broker"),
    "pause-consumer": ("worker paused", "resume-consumer"),
    "kill-producer": ("producer killed", None),
    "kill-consumer": ("worker killed", None),
    "hang-transaction": ("hanging transaction", None),
}


def build(events: Iterable[Event]) -> dict[str, Any]:
    """The run's timeline: `duration`, fault `bands`, client `lanes` and `buckets` of sends, acks
    and ack latency."""
    ordered = sorted(
        (event for event in events if event["process"] != FINAL_READ), key=lambda event: event["time"]
    )
    if not ordered:
        return {"duration": 0.0, "bands": [], "lanes": [], "bucket_s": MIN_BUCKET_S, "buckets": []}
    start = ordered[0]["time"]
    duration = max(ordered[-1]["time"] - start, MIN_BUCKET_S)
    lanes = _lanes(ordered, start)
    return {
        "duration": round(duration, 3),
        "bands": _bands(ordered, start, lanes, duration),
        "lanes": lanes,
        **_buckets(ordered, start, duration),
    }


def _lanes(ordered: Sequence[Event], start: float) -> list[dict[str, Any]]:
    """One lane per client; each incarnation a span, and whether a later one replaced it."""
    spans: dict[str, dict[int, list[float]]] = defaultdict(dict)
    for event in ordered:
        name, _, incarnation = event["process"].partition(".")
        if incarnation.isdigit():
            at = event["time"] - start
            span = spans[name].setdefault(int(incarnation), [at, at])
            span[1] = at
    lanes = []
    for name in sorted(spans):
        last = max(spans[name])
        lanes.append(
            {
                "name": name,
                "spans": [
                    {
                        "incarnation": number,
                        "start": round(begin, 3),
                        "end": round(end, 3),
                        "replaced": number != last,
                    }
                    for number, (begin, end) in sorted(spans[name].items())
                ],
            }
        )
    return lanes


def _bands(
    ordered: Sequence[Event], start: float, lanes: Sequence[Mapping[str, Any]], duration: float
) -> list[dict[str, Any]]:
    spans = {lane["name"]: lane["spans"] for lane in lanes}
    open_bands: dict[str, dict[str, Any]] = {}
    bands: list[dict[str, Any]] = []
    for event in ordered:
        if event["process"] != LAB_PROCESS or event["type"] != "fault":
            continue
        action, at = event["action"], event["time"] - start
        if action in open_bands:  # the end of a band still open
            open_bands.pop(action)["end"] = round(at, 3)
            continue
        if action not in BAND_ENDS:
            continue
        title, end_action = BAND_ENDS[action]
        target = event.get("target")
        band = {"label": title, "start": round(at, 3), "end": round(min(at + KILL_BAND_S, duration), 3)}
        if action in ("kill-producer", "kill-consumer"):
            name = f"{'producer' if action == 'kill-producer' else 'worker'}-{target}"
            band["label"] = f"{name} killed"
            # Until its next incarnation came up.
            later = [span["start"] for span in spans.get(name, []) if span["start"] > at]
            if later:
                band["end"] = round(min(later), 3)
        elif action == "hang-transaction":
            band["end"] = round(min(at + faults.HANGING_TIMEOUT_MS / 1000, duration), 3)
        elif action == "pause-consumer":
            band["label"] = f"worker-{target} paused"
        bands.append(band)
        if end_action is not None:
            open_bands[end_action] = band
    for band in open_bands.values():
        band["end"] = round(duration, 3)  # never ended: until the end of the run
    return bands


def _buckets(ordered: Sequence[Event], start: float, duration: float) -> dict[str, Any]:
    bucket_s = max(MIN_BUCKET_S, math.ceil(duration / BUCKETS / MIN_BUCKET_S) * MIN_BUCKET_S)
    count = max(1, math.ceil(duration / bucket_s))
    sends, acks = [0] * count, [0] * count
    latencies: list[list[float]] = [[] for _ in range(count)]
    sent_at: dict[str, float] = {}
    for event in ordered:
        slot = min(int((event["time"] - start) / bucket_s), count - 1)
        if event["type"] == "send" and event["process"].startswith("producer"):
            sends[slot] += 1
            sent_at.setdefault(event["value"], event["time"])
        elif event["type"] == "ack" and event["process"].startswith("producer"):
            acks[slot] += 1
            if event["value"] in sent_at:
                latencies[slot].append((event["time"] - sent_at[event["value"]]) * 1000)
    return {
        "bucket_s": bucket_s,
        "buckets": [
            {
                "start": round(index * bucket_s, 3),
                "sends": sends[index],
                "acks": acks[index],
                "latency_p50_ms": round(statistics.median(latencies[index]), 1) if latencies[index] else None,
                "latency_max_ms": round(max(latencies[index]), 1) if latencies[index] else None,
            }
            for index in range(count)
        ],
    }


def context(events: Iterable[Event], values: Iterable[str]) -> list[dict[str, Any]]:
    """The operations that touch `values`, with a few before the first and after the last of
    them, in time order: what a reader needs to see how the anomaly came about."""
    wanted = set(values)
    ordered = sorted(
        (event for event in events if event["type"] != "read" and event["process"] != FINAL_READ),
        key=lambda event: event["time"],
    )
    if not ordered:
        return []
    start = ordered[0]["time"]
    touching = [index for index, event in enumerate(ordered) if wanted & _values(event)]
    if not touching:
        return []
    chosen = set(touching[: MAX_CONTEXT - 2 * CONTEXT])
    chosen |= set(range(max(0, touching[0] - CONTEXT), touching[0]))
    chosen |= set(range(touching[-1] + 1, min(len(ordered), touching[-1] + 1 + CONTEXT)))
    return [
        {
            "at": round(ordered[index]["time"] - start, 3),
            "process": ordered[index]["process"],
            "op": describe(ordered[index], wanted),
            "touches": index in touching,
        }
        for index in sorted(chosen)
    ]


def _values(event: Event) -> set[str]:
    if "value" in event:
        return {str(event["value"])}
    if event["type"] == "txn":
        return set(event["values"])
    if event["type"] == "poll":
        return {str(value) for _p, _o, value in event["records"]}
    return set()


def describe(event: Event, wanted: Collection[str] = ()) -> str:
    """One operation as a reader would say it, e.g. "ack p1-7 at input/2@41"."""
    kind = event["type"]
    if kind == "send":
        return f"send {event['value']}"
    if kind == "ack":
        where = (
            ""
            if event.get("offset") is None
            else f" at partition {event['partition']} offset {event['offset']}"
        )
        return f"ack {event['value']}{where}"
    if kind == "fail":
        return f"send of {event['value']} failed: {event.get('error', 'unknown error')}"
    if kind in ("written", "unhandled-ack"):
        where = (
            ""
            if event.get("offset") is None
            else f" at partition {event['partition']} offset {event['offset']}"
        )
        what = "in the open transaction" if kind == "written" else "ack never handled: the producer dies"
        return f"stored {event['value']}{where} ({what})"
    if kind == "commit-txn":
        return "ask to commit the transaction"
    if kind == "txn":
        return f"transaction of {len(event['values'])} values {event['outcome']}"
    if kind == "poll":
        records = event["records"]
        hits = [f"{value} (partition {p} offset {o})" for p, o, value in records if value in wanted]
        shown = f": {', '.join(hits)}" if hits else ""
        return f"poll {len(records)} records ({event['isolation'].replace('_', ' ')}){shown}"
    if kind in ("commit", "processed"):
        offsets = ", ".join(f"partition {p} to {o}" for p, o in event["offsets"])
        return f"{'commit offsets' if kind == 'commit' else 'output written, offsets'} {offsets}"
    if kind == "assign":
        return f"assigned partitions {', '.join(str(p) for p in event['partitions']) or 'none'}"
    if kind in ("crash", "pause", "resume"):
        return f"{kind} at {str(event['point']).replace('-', ' ')}"
    if kind == "fault":
        target = event.get("target")
        return f"fault: {event['action']}" + ("" if target is None else f" (target {target})")
    return str(kind)
