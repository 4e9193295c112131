"""The Grafana dashboard in the repository asks only for metrics a broker serves: every metric
name in its queries is one a broker with --metrics exposes (a renamed metric would leave a panel
empty without an error anywhere)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from onceflow import EmbeddedBroker

DASHBOARD = Path(__file__).parent.parent / "dashboards" / "onceflow-brokers.json"
_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}
_NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and template variables."""
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    found += [
        variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable
    ]
    return found


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    text = re.sub(r"label_values\(\s*([\w:]+)\s*,\s*\w+\s*\)", r"\1", expression)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", text)  # strings (label values)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)  # label matchers and ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        name, is_call = match.groups()
        if not is_call and name not in _NOT_METRICS:
            names.add(name)
    return names


def unserved(dashboard: dict[str, Any], served: set[str]) -> dict[str, set[str]]:
    """Each query that names a metric not served, with those names."""
    missing = {query: metric_names(query) - served for query in queries(dashboard)}
    return {query: names for query, names in missing.items() if names}


def served_names(url: str) -> set[str]:
    """Every sample name a broker serves, also those of metrics with no sample yet."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in _SAMPLE_SUFFIXES.get(family.type, ("",))
    }


def test_every_query_of_the_dashboard_names_a_served_metric(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    with EmbeddedBroker(tmp_path, metrics_port=0) as broker:
        served = served_names(broker.metrics_url)
    assert len(queries(dashboard)) >= 20  # the precondition: the checker reads the queries
    named = set().union(*(metric_names(query) for query in queries(dashboard)))
    assert "kafka_server_replicamanager_under_replicated_partitions" in named
    assert unserved(dashboard, served) == {}

    # The control: a panel asking for a misspelled metric is caught.
    forged = json.loads(DASHBOARD.read_text())
    forged["panels"][1]["targets"][0]["expr"] = "sum(kafka_server_replicamanager_underreplicated_partitions)"
    assert unserved(forged, served) == {
        "sum(kafka_server_replicamanager_underreplicated_partitions)": {
            "kafka_server_replicamanager_underreplicated_partitions"
        }
    }


def test_metric_names_reads_promql() -> None:
    expression = (
        'histogram_quantile(0.99, sum by (le, request) (rate(requests_bucket{error!="NONE", a=~"$x"}'
        "[$__rate_interval]))) < ignoring(instance) group_left other_metric"
    )
    assert metric_names(expression) == {"requests_bucket", "other_metric"}
    assert metric_names("label_values(partition_count, instance)") == {"partition_count"}
