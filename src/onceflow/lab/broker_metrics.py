"""A few of the broker's Prometheus metrics (docs/metrics.md), read at the end of a run and said in one line.

The lab's own broker serves them (`onceflow broker --metrics`); the digest is what an operator would
glance at to see what the run asked of the broker: requests per API, error answers, bytes in and out,
fsyncs and their slowest, transactions left open.
"""

from __future__ import annotations

import math
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from onceflow.lab.report import label

# The APIs the line names; the rest are counted in the total.
SHOWN_APIS = ("Produce", "Fetch", "EndTxn", "TxnOffsetCommit", "OffsetCommit")


@dataclass(frozen=True)
class BrokerMetrics:
    requests: dict[str, float] = field(default_factory=dict)  # per Kafka API name
    error_answers: float = 0.0  # error codes other than NONE, in all answers
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    flushes: float = 0.0
    flush_p99_s: float = 0.0  # the upper bound of the histogram bucket holding the 99th percentile
    open_transactions: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "error_answers": self.error_answers,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "flushes": self.flushes,
            "flush_p99_s": self.flush_p99_s,
            "open_transactions": self.open_transactions,
        }

    def summary(self) -> str:
        """One line, for the end of a run."""
        shown = ", ".join(f"{api} {self.requests[api]:.0f}" for api in SHOWN_APIS if self.requests.get(api))
        p99 = "over 1 s" if math.isinf(self.flush_p99_s) else f"p99 ≤ {self.flush_p99_s * 1000:g} ms"
        return (
            f"{sum(self.requests.values()):.0f} requests ({shown}), {self.error_answers:.0f} error answers, "
            f"{self.bytes_in / 1e6:.2f} MB in, {self.bytes_out / 1e6:.2f} MB out, "
            f"{self.flushes:.0f} fsyncs {p99}, {self.open_transactions:.0f} transactions open"
        )


def parse(text: str) -> BrokerMetrics:
    """The digest of one scrape in Prometheus text format."""
    requests: defaultdict[str, float] = defaultdict(float)
    values: defaultdict[str, float] = defaultdict(float)
    flush_buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kafka_network_requestmetrics_requests_total":
                requests[sample.labels["request"]] += sample.value
            elif sample.name == "kafka_network_requestmetrics_errors_total":
                if sample.labels["error"] != "NONE":
                    values["error_answers"] += sample.value
            elif sample.name == "kafka_server_brokertopicmetrics_bytes_in_total":
                values["bytes_in"] += sample.value
            elif sample.name == "kafka_server_brokertopicmetrics_bytes_out_total":
                values["bytes_out"] += sample.value
            elif sample.name == "kafka_log_logflushstats_log_flush_seconds_bucket":
                flush_buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name == "onceflow_transactions_open":
                values["open_transactions"] += sample.value
    flush_buckets.sort()
    flushes = flush_buckets[-1][1] if flush_buckets else 0.0
    return BrokerMetrics(
        requests=dict(requests),
        error_answers=values["error_answers"],
        bytes_in=values["bytes_in"],
        bytes_out=values["bytes_out"],
        flushes=flushes,
        flush_p99_s=next((bound for bound, count in flush_buckets if count >= 0.99 * flushes), 0.0)
        if flushes
        else 0.0,
        open_transactions=values["open_transactions"],
    )


def scrape(url: str, timeout_s: float = 5.0) -> BrokerMetrics:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse(response.read().decode("utf-8"))


def summaries(runs: list[dict[str, Any]]) -> list[str]:
    """A line per run (in the reports' shape) whose broker was scraped."""
    lines = []
    for run in runs:
        if run.get("broker_metrics"):
            summary = BrokerMetrics(**run["broker_metrics"]).summary()
            lines.append(f"broker of {run.get('stage', 'lab')} {label(run)}: {summary}")
    return lines
