"""Reports of lab runs: a rich table, JSON, and a self-contained HTML page with an SVG chart.

Every function takes runs as plain dicts, in the shape of `RunResult.to_json()`: the keys
guarantee, faults, produced, acknowledged, delivered, lost, duplicated, aborted_reads and
anomalies, and for lab runs coverage and verdicts. A count whose verdict is "not tested" (the run
never created the anomaly's preconditions) is shown as such, never as a clean 0. Other keys (a
demo's balances, say) are kept in the JSON and shown in the HTML table.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

Run = Mapping[str, Any]
COUNTS = ("produced", "acknowledged", "delivered", "lost", "duplicated", "aborted_reads")
SERIES = (("lost", "#d62728"), ("duplicated", "#ff7f0e"), ("aborted_reads", "#9467bd"))
SHOWN_ANOMALIES = 20
HEADERS = {"acknowledged": "acked", "duplicated": "dup", "aborted_reads": "aborted"}
NOT_TESTED = "not tested"
# Shown apart from the other keys of a run.
JUDGEMENT_KEYS = ("coverage", "verdicts", "broker_fault_effects")


def label(run: Run) -> str:
    text = f"{run['guarantee']} / {', '.join(run['faults']) or 'no faults'}"
    return text + (f" / broker fault {run['broker_fault']}" if run.get("broker_fault") else "")


def untested(run: Run, key: str) -> bool:
    return bool(run.get("verdicts", {}).get(key) == NOT_TESTED)


def coverage_text(run: Run) -> str:
    """The counters that are not zero, e.g. "aborted records in log 20, acks lost 3"."""
    counts = run.get("coverage") or {}
    return ", ".join(f"{name.replace('_', ' ')} {count}" for name, count in counts.items() if count)


def print_table(
    runs: Sequence[Run], console: Console | None = None, title: str = "delivery-semantics lab"
) -> None:
    # Runs of the demo also say which stage they come from and whether database balances matched.
    staged = any("stage" in run for run in runs)
    balanced = any("balances_match" in run for run in runs)
    table = Table(title=title)
    if staged:
        table.add_column("stage", no_wrap=True)
    table.add_column("guarantee", no_wrap=True)
    table.add_column("faults", overflow="fold")
    for key in COUNTS:
        table.add_column(HEADERS.get(key, key), justify="right")
    if balanced:
        table.add_column("balances")
    covered = any("coverage" in run for run in runs)
    if covered:
        table.add_column("coverage (preconditions created)", overflow="fold")
    table.add_column("anomalies", overflow="fold")
    for run in runs:
        kinds = Counter(anomaly["kind"] for anomaly in run["anomalies"])
        cells = [run.get("stage", "")] if staged else []
        faults = ", ".join(run["faults"]) or "none"
        if run.get("broker_fault"):
            faults += f"; broker fault {run['broker_fault']}"
        cells += [run["guarantee"], faults]
        cells += [_count_cell(run, key) for key in COUNTS]
        if balanced:
            match = run.get("balances_match")
            cells.append("" if match is None else "[green]exact[/]" if match else "[bold red]wrong[/]")
        if covered:
            cells.append(coverage_text(run) or ("[yellow]none[/]" if "coverage" in run else ""))
        cells.append(
            ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())) or "[green]none[/]"
        )
        table.add_row(*cells)
    (console or Console()).print(table)


def _count_cell(run: Run, key: str) -> str:
    if untested(run, key):
        return f"[yellow]{NOT_TESTED}[/]"
    value = run[key]
    bad = key in ("lost", "duplicated", "aborted_reads") and value > 0
    return f"[bold red]{value}[/]" if bad else str(value)


def write_json(runs: Sequence[Run], path: Path) -> None:
    path.write_text(json.dumps({"runs": list(runs)}, indent=2) + "\n", encoding="utf-8")


def write_html(runs: Sequence[Run], path: Path, title: str = "onceflow delivery-semantics lab") -> None:
    path.write_text(render_html(runs, title), encoding="utf-8")


def render_html(runs: Sequence[Run], title: str = "onceflow delivery-semantics lab") -> str:
    """One page, no external resources: the chart is inline SVG, the styles and script inline."""
    shown = {*COUNTS, *JUDGEMENT_KEYS, "guarantee", "faults", "broker_fault", "anomalies"}
    extra = sorted({key for run in runs for key in run} - shown)
    head = "".join(f"<th>{html.escape(name)}</th>" for name in ["run", *COUNTS, "coverage", *extra])
    rows = "".join(
        "<tr><td>{}</td>{}<td>{}</td>{}</tr>".format(
            html.escape(label(run)),
            "".join(_html_count(run, key) for key in COUNTS),
            html.escape(coverage_text(run) or ("none" if "coverage" in run else "")),
            "".join(f"<td>{html.escape(json.dumps(run.get(key)))}</td>" for key in extra),
        )
        for run in runs
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; background: #fff; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
td:first-child {{ text-align: left; }}
td.bad {{ color: #d62728; font-weight: bold; }}
td.untested {{ color: #b8860b; font-style: italic; }}
li {{ font-family: monospace; font-size: 12px; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>Lost, duplicated and aborted-read values per guarantee and fault set. A count is "not tested"
when the run never created that anomaly's preconditions (coverage), so its zero proves nothing.</p>
{_chart(runs)}
<table><tr>{head}</tr>{rows}</table>
{_anomaly_lists(runs)}
<script>
// The tests read this title back to know the page rendered its chart.
const bars = document.querySelectorAll("svg#chart rect.bar").length;
document.title = bars > 0 ? "lab chart: " + bars + " bars" : "lab chart missing";
</script>
</body></html>
"""


def _html_count(run: Run, key: str) -> str:
    if untested(run, key):
        return f'<td class="untested">{NOT_TESTED}</td>'
    value = run[key]
    bad = key in ("lost", "duplicated", "aborted_reads") and value > 0
    return f'<td class="{"bad" if bad else ""}">{value}</td>'



def _chart(runs: Sequence[Run]) -> str:
    bar_w, gap, plot_h, top, left = 22, 30, 260, 30, 50
    group_w = bar_w * len(SERIES) + gap
    width = left + max(1, len(runs)) * group_w + 20
    height = top + plot_h + 120
    peak = max([1, *(int(run[key]) for run in runs for key, _color in SERIES)])
    parts = [
        f'<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img">',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 10}" y2="{top + plot_h}" stroke="#333"/>',
        f'<text x="{left - 8}" y="{top + 4}" text-anchor="end" font-size="11">{peak}</text>',
        f'<text x="{left - 8}" y="{top + plot_h}" text-anchor="end" font-size="11">0</text>',
    ]
    for index, run in enumerate(runs):
        x0 = left + index * group_w + gap / 2
        for offset, (key, color) in enumerate(SERIES):
            value = int(run[key])
            h = max(1.0, plot_h * value / peak)  # a zero still shows as a hairline
            x = x0 + offset * bar_w
            shown = "n/t" if untested(run, key) else str(value)
            parts.append(
                f'<rect class="bar" x="{x}" y="{top + plot_h - h}" width="{bar_w - 4}" height="{h}" '
                f'fill="{color}"><title>{html.escape(label(run))}: {key} '
                f'{NOT_TESTED if untested(run, key) else value}</title></rect>'
                f'<text x="{x + (bar_w - 4) / 2}" y="{top + plot_h - h - 4}" text-anchor="middle" '
                f'font-size="10">{shown}</text>'
            )
        cx, cy = x0 + bar_w * len(SERIES) / 2, top + plot_h + 12
        parts.append(
            f'<text x="{cx}" y="{cy}" font-size="11" text-anchor="end" '
            f'transform="rotate(-35 {cx} {cy})">{html.escape(label(run))}</text>'
        )
    for offset, (key, color) in enumerate(SERIES):
        x = left + offset * 130
        parts.append(
            f'<rect x="{x}" y="6" width="12" height="12" fill="{color}"/>'
            f'<text x="{x + 16}" y="16" font-size="12">{key.replace("_", " ")}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _anomaly_lists(runs: Sequence[Run]) -> str:
    sections = []
    for run in runs:
        anomalies = run["anomalies"]
        if not anomalies:
            continue
        items = "".join(
            "<li>{}: {} at {} — {}</li>".format(
                html.escape(anomaly["kind"]),
                html.escape(", ".join(anomaly["values"])),
                html.escape(
                    ", ".join(f"{o['topic']}/{o['partition']}@{o['offset']}" for o in anomaly["offsets"])
                ),
                html.escape(anomaly["detail"]),
            )
            for anomaly in anomalies[:SHOWN_ANOMALIES]
        )
        more = len(anomalies) - SHOWN_ANOMALIES
        tail = f"<li>... and {more} more</li>" if more > 0 else ""
        sections.append(f"<h2>{html.escape(label(run))}</h2><ul>{items}{tail}</ul>")
    return "\n".join(sections)
