"""Reports of lab runs: rich tables that fit 80 columns, JSON, and a self-contained HTML page
after Jepsen's: per run a timeline with the faults as shaded bands and the sends' throughput and
ack latency over time, the matrix (measured against predicted), the coverage table, and each
anomaly explained with the history operations around it.

Every function takes runs as plain dicts, in the shape of `RunResult.to_json()`: the keys
guarantee, faults, produced, acknowledged, delivered, lost, duplicated, aborted_reads and
anomalies, and for lab runs coverage, verdicts and timeline. A count whose verdict is "not
tested" (the run never created the anomaly's preconditions) is shown as such, never as a clean 0.
Every table cell holds text for people (`human`), never JSON.
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
HISTORIES_PER_KIND = 3  # anomalies of each kind shown with their history operations
NOT_TESTED = "not tested"
NOT_TESTED_NOTE = "n/t: not tested (the run never created the anomaly's preconditions)"
HEADERS = {
    "produced": "sent",
    "acknowledged": "acked",
    "delivered": "deliv",
    "lost": "lost",
    "duplicated": "dup",
    "aborted_reads": "aborted",
}
HTML_HEADERS = {"aborted_reads": "aborted reads"}
# What each anomaly kind means, for the reader of the report.
EXPLANATIONS = {
    "lost-write": "The producer was told this value was stored, yet the final read_committed read of"
    " the input does not hold it: an acknowledged write was lost.",
    "lost-downstream": "The value reached the input but never the output: a worker moved its"
    " committed offset past it without writing its result (at-most-once commits first).",
    "duplicate": "The value is stored more than once: a send retried after its ack was lost, or"
    " records processed again by a worker that crashed before it committed.",
    "aborted-read": "A read_committed reader saw (or passed on) a record of an aborted"
    " transaction, which it must skip.",
    "inconsistent-offset": "One offset held different values in different reads: the log was"
    " rewritten under its readers.",
    "non-monotonic-poll": "A consumer polled an offset at or before one it had already polled,"
    " without a new assignment in between.",
    "skipping-poll": "A consumer jumped over records its isolation level could read.",
    "wrong-balance": "The database balance differs from the exact sum of the committed payments.",
}
FONT_PX = 11
CHAR_PX = 7.0  # an upper bound of a character's width at FONT_PX in a sans-serif face


def human(value: Any) -> str:
    """A value as a table cell says it: no JSON (`null`, quotes, brackets)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{str(key).replace('_', ' ')} {human(item)}" for key, item in value.items()) or "-"
    if isinstance(value, list | tuple | set):
        return ", ".join(human(item) for item in value) or "-"
    return str(value)


def label(run: Run) -> str:
    text = f"{run['guarantee']} / {', '.join(run['faults']) or 'no faults'}"
    return text + (f" / broker fault {run['broker_fault']}" if run.get("broker_fault") else "")


def untested(run: Run, key: str) -> bool:
    return bool(run.get("verdicts", {}).get(key) == NOT_TESTED)


def coverage_text(run: Run) -> str:
    """The counters that are not zero, e.g. "aborted records in log 20, acks lost 3"."""
    counts = run.get("coverage") or {}
    return ", ".join(f"{name.replace('_', ' ')} {count}" for name, count in counts.items() if count)


def anomalies_text(run: Run) -> str:
    kinds = Counter(anomaly["kind"] for anomaly in run["anomalies"])
    return ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())) or "none"


def print_table(
    runs: Sequence[Run], console: Console | None = None, title: str = "delivery-semantics lab"
) -> None:
    """One row of counts per run, then a line per run with its coverage and anomalies: the long
    texts wrap as sentences below the table, so that it fits 80 columns."""
    # No box: two spaces between columns, so that the counts fit beside the faults.
    table = Table(title=title, box=None, padding=(0, 1), pad_edge=False, header_style="bold underline")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("guarantee", no_wrap=True)
    table.add_column("faults", min_width=17, ratio=1)
    for key in COUNTS:
        table.add_column(HEADERS[key], justify="right", no_wrap=True)
    for number, run in enumerate(runs, 1):
        guarantee = run["guarantee"] + (f"\n[dim]{run['stage']}[/]" if "stage" in run else "")
        faults = ", ".join(run["faults"]) or "none"
        if run.get("broker_fault"):
            faults += f"; broker fault {run['broker_fault']}"
        table.add_row(str(number), guarantee, faults, *(_count_cell(run, key) for key in COUNTS))
    console = console or Console()
    console.print(table)
    for number, run in enumerate(runs, 1):
        notes = []
        if "coverage" in run:
            notes.append(f"coverage: {coverage_text(run) or '[yellow]none[/]'}")
        if run.get("balances_match") is not None:
            notes.append(
                "balances: " + ("[green]exact[/]" if run["balances_match"] else "[bold red]wrong[/]")
            )
        shown = anomalies_text(run)
        notes.append(f"anomalies: {'[green]none[/]' if shown == 'none' else shown}")
        console.print(f"  #{number} " + "; ".join(notes), highlight=False)
    if any(untested(run, key) for run in runs for key in COUNTS):
        console.print(f"  {NOT_TESTED_NOTE}", highlight=False)


def _count_cell(run: Run, key: str) -> str:
    if untested(run, key):
        return "[yellow]n/t[/]"
    value = run[key]
    bad = key in ("lost", "duplicated", "aborted_reads") and value > 0
    return f"[bold red]{value}[/]" if bad else str(value)


def write_json(runs: Sequence[Run], path: Path) -> None:
    path.write_text(json.dumps({"runs": list(runs)}, indent=2) + "\n", encoding="utf-8")


def write_html(
    runs: Sequence[Run],
    path: Path,
    title: str = "onceflow delivery-semantics lab",
    matrix: Sequence[Mapping[str, Any]] = (),
) -> None:
    path.write_text(render_html(runs, title, matrix), encoding="utf-8")


def render_html(
    runs: Sequence[Run],
    title: str = "onceflow delivery-semantics lab",
    matrix: Sequence[Mapping[str, Any]] = (),
) -> str:
    """One page, no external resources: the charts are inline SVG, the styles and script inline."""
    sections = [
        _matrix_table(matrix, runs),
        "<h2>Runs</h2>",
        _runs_table(runs),
        _summary_chart(runs),
        _coverage_table(runs),
        *(_run_section(number, run) for number, run in enumerate(runs, 1)),
    ]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; background: #fff; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; vertical-align: top; }}
td.text, th.text {{ text-align: left; }}
td.bad {{ color: #d62728; font-weight: bold; }}
td.untested {{ color: #b8860b; font-style: italic; }}
td.good {{ color: #2ca02c; }}
tr.touches td {{ background: #fff3cd; }}
table.history td:nth-child(-n+2) {{ white-space: nowrap; }}
svg {{ display: block; margin: 0.5em 0; overflow: hidden; }}
svg text {{ font-family: sans-serif; font-size: {FONT_PX}px; fill: #222; }}
p.explain {{ max-width: 60em; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>Lost, duplicated and aborted-read values per guarantee and fault set. A count is "not tested"
when the run never created that anomaly's preconditions (see the coverage table), so its zero
proves nothing. Each run below has a timeline: its clients' lives (a cross where one died and was
started again), the faults as shaded bands, and the sends' throughput and ack latency.</p>
{"".join(sections)}
<script>
{SELF_CHECK}
</script>
</body></html>
"""


# The page checks itself once rendered (tests read the title back through headless Chromium): every
# SVG label lies inside its drawing, no table cell holds JSON, and the summary chart has its bars.
SELF_CHECK = r"""
(function () {
  const problems = [];
  for (const svg of document.querySelectorAll("svg")) {
    const frame = svg.getBoundingClientRect();
    for (const text of svg.querySelectorAll("text")) {
      const box = text.getBoundingClientRect();
      if (box.left < frame.left - 0.5 || box.right > frame.right + 0.5 ||
          box.top < frame.top - 0.5 || box.bottom > frame.bottom + 0.5) {
        problems.push("clipped label: " + text.textContent);
      }
    }
  }
  const json = /^(null|undefined|NaN|true|false|None|\[[\s\S]*\]|\{[\s\S]*\}|"[\s\S]*")$/;
  for (const cell of document.querySelectorAll("td, th")) {
    const text = cell.textContent.trim();
    if (json.test(text)) problems.push("raw JSON in a cell: " + text);
  }
  if (document.querySelectorAll("svg#chart rect.bar").length === 0) problems.push("chart missing");
  document.title = problems.length ? "report broken: " + problems.slice(0, 3).join("; ") : "report ok";
})();
"""


def _cells(values: Sequence[str], header: bool = False, text_columns: int = 1) -> str:
    tag = "th" if header else "td"
    return "".join(
        f"<{tag}{' class=text' if index < text_columns else ''}>{html.escape(value)}</{tag}>"
        for index, value in enumerate(values)
    )


def _html_count(run: Run, key: str) -> str:
    if untested(run, key):
        return f'<td class="untested">{NOT_TESTED}</td>'
    value = run[key]
    bad = key in ("lost", "duplicated", "aborted_reads") and value > 0
    return f'<td class="{"bad" if bad else ""}">{html.escape(human(value))}</td>'


def _runs_table(runs: Sequence[Run]) -> str:
    balanced = any("balances_match" in run for run in runs)
    names = ["#", "run", *(HTML_HEADERS.get(key, key) for key in COUNTS), "drained", "seed"]
    names += ["balances"] if balanced else []
    rows = []
    for number, run in enumerate(runs, 1):
        name = (f"{run['stage']}: " if "stage" in run else "") + label(run)
        cells = f"<td>{number}</td><td class=text>{html.escape(name)}</td>"
        cells += "".join(_html_count(run, key) for key in COUNTS)
        cells += _cells([human(run.get("drained")), human(run.get("seed"))], text_columns=0)
        if balanced:
            match = run.get("balances_match")
            cells += _cells(["-" if match is None else "exact" if match else "wrong"], text_columns=0)
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{_cells(names, header=True, text_columns=2)}</tr>{''.join(rows)}</table>"


def _coverage_table(runs: Sequence[Run]) -> str:
    covered = [(number, run) for number, run in enumerate(runs, 1) if "coverage" in run]
    if not covered:
        return ""
    counters = list(dict.fromkeys(name for _number, run in covered for name in run["coverage"]))
    verdicts = list(dict.fromkeys(name for _number, run in covered for name in run.get("verdicts", {})))
    head = ["#", *(name.replace("_", " ") for name in counters)]
    head += [f"{name.replace('_', ' ')} verdict" for name in verdicts]
    rows = []
    for number, run in covered:
        cells = [str(number), *(human(run["coverage"].get(name)) for name in counters)]
        cells += [human(run.get("verdicts", {}).get(name)) for name in verdicts]
        rows.append(f"<tr>{_cells(cells, text_columns=0)}</tr>")
    return (
        "<h2>Coverage: the preconditions each run created</h2>"
        f"<table><tr>{_cells(head, header=True, text_columns=0)}</tr>{''.join(rows)}</table>"
    )


def _matrix_table(rows: Sequence[Mapping[str, Any]], runs: Sequence[Run]) -> str:
    if not rows:
        return ""
    anomalies = ("lost", "duplicated", "aborted_reads")
    head = ["run", "failure", "guarantee", *(HTML_HEADERS.get(name, name) for name in anomalies), "agrees"]
    body = []
    for row in rows:
        # The number of the cell's run among the page's runs, when the page shows it.
        number = next((f"#{index}" for index, run in enumerate(runs, 1) if run is row["run"]), "-")
        cells = _cells([number, f"{row['failure']}: {row['title']}", row["guarantee"]], text_columns=3)
        for name in anomalies:
            cell = row["cells"].get(name)
            if cell is None:
                cells += '<td class="text">no promise</td>'
                continue
            measured = NOT_TESTED if cell["measured"] is None else str(cell["measured"])
            verdict = "disagrees" if cell["agrees"] is False else "agrees" if cell["agrees"] else ""
            css = "bad" if cell["agrees"] is False else "untested" if cell["measured"] is None else "text"
            text = f"measured {measured}, predicted {cell['predicted']}" + (f": {verdict}" if verdict else "")
            cells += f'<td class="{css}">{html.escape(text)}</td>'
        agrees = row["agrees"]
        css, text = (
            ("good", "yes") if agrees else ("bad", "no") if agrees is False else ("untested", NOT_TESTED)
        )
        body.append(f'<tr>{cells}<td class="{css}">{text}</td></tr>')
    return (
        "<h2>Matrix: each failure alone against each guarantee</h2>"
        "<p>Predicted: <em>never</em> is a promise the measurement must keep (0), <em>may</em> allows any"
        " count.</p>"
        f"<table><tr>{_cells(head, header=True, text_columns=3)}</tr>{''.join(body)}</table>"
    )


def _summary_chart(runs: Sequence[Run]) -> str:
    """Lost, duplicated and aborted reads per run, the runs numbered as in the tables."""
    bar_w, gap, plot_h, top, left, bottom = 22, 30, 200, 40, 50, 30
    group_w = bar_w * len(SERIES) + gap
    width = max(left + max(1, len(runs)) * group_w + 20, 3 * 130 + left)
    height = top + plot_h + bottom
    peak = max([1, *(int(run[key]) for run in runs for key, _color in SERIES)])
    parts = [
        _svg_open("chart", width, height),
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 10}" y2="{top + plot_h}" stroke="#333"/>',
        f'<text x="{left - 8}" y="{top + 4}" text-anchor="end">{peak}</text>',
        f'<text x="{left - 8}" y="{top + plot_h}" text-anchor="end">0</text>',
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
                f"{NOT_TESTED if untested(run, key) else value}</title></rect>"
                f'<text x="{x + (bar_w - 4) / 2}" y="{top + plot_h - h - 4}" '
                f'text-anchor="middle">{shown}</text>'
            )
        parts.append(
            f'<text x="{x0 + bar_w * len(SERIES) / 2}" y="{top + plot_h + 16}" text-anchor="middle">'
            f"#{index + 1}</text>"
        )
    for offset, (key, color) in enumerate(SERIES):
        x = left + offset * 130
        parts.append(
            f'<rect x="{x}" y="8" width="12" height="12" fill="{color}"/>'
            f'<text x="{x + 16}" y="18">{key.replace("_", " ")}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _svg_open(name: str, width: float, height: float) -> str:
    return (
        f'<svg id="{name}" xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}" role="img">'
    )


PLOT_W = 720


def _x_axis(duration: float, left: float, y: float) -> list[str]:
    """Tick marks and labels in seconds under a plot PLOT_W wide."""
    step = next(s for s in (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1e9) if duration / s <= 10)
    parts = [f'<line x1="{left}" y1="{y}" x2="{left + PLOT_W}" y2="{y}" stroke="#333"/>']
    tick = 0.0
    while tick <= duration + 1e-9:
        x = left + PLOT_W * tick / duration
        parts.append(
            f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#333"/>'
            f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{tick:g} s</text>'
        )
        tick += step
    return parts


def _fault_bands(timeline: Mapping[str, Any], left: float, top: float, height: float) -> list[str]:
    duration = timeline["duration"]
    parts = []
    for band in timeline["bands"]:
        x = left + PLOT_W * band["start"] / duration
        w = max(2.0, PLOT_W * (band["end"] - band["start"]) / duration)
        parts.append(
            f'<rect class="fault" x="{x:.1f}" y="{top}" width="{w:.1f}" height="{height}" '
            f'fill="#d62728" fill-opacity="0.12"><title>{html.escape(band["label"])}: '
            f"{band['start']:g} s to {band['end']:g} s</title></rect>"
        )
    return parts


def _timeline_chart(number: int, timeline: Mapping[str, Any]) -> str:
    """The clients' lives as lanes, the faults as bands across them and listed under the axis."""
    lanes, bands = timeline["lanes"], timeline["bands"]
    lane_h, top = 22, 10
    names = [lane["name"] for lane in lanes]
    left = 16 + CHAR_PX * max([len(name) for name in names] + [6])
    plot_h = lane_h * max(1, len(lanes))
    band_lines = [f"{band['label']}: {band['start']:g} s to {band['end']:g} s" for band in bands]
    width = left + PLOT_W + 30
    height = top + plot_h + 30 + 16 * len(band_lines) + 8
    width = max(width, 16 + CHAR_PX * max([len(line) for line in band_lines] + [0]))
    duration = timeline["duration"]
    parts = [_svg_open(f"timeline-{number}", width, height)]
    parts += _fault_bands(timeline, left, top, plot_h)
    for row, lane in enumerate(lanes):
        y = top + row * lane_h
        parts.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{html.escape(lane["name"])}</text>'
        )
        for span in lane["spans"]:
            x1 = left + PLOT_W * span["start"] / duration
            x2 = max(x1 + 2, left + PLOT_W * span["end"] / duration)
            parts.append(
                f'<rect x="{x1:.1f}" y="{y + 6}" width="{x2 - x1:.1f}" height="10" fill="#1f77b4">'
                f"<title>{html.escape(lane['name'])}.{span['incarnation']}: {span['start']:g} s to "
                f"{span['end']:g} s</title></rect>"
            )
            if span["replaced"]:
                parts.append(
                    f'<path d="M{x2 - 4:.1f} {y + 3} l8 16 m0 -16 l-8 16" stroke="#d62728" stroke-width="2"/>'
                )
    parts += _x_axis(duration, left, top + plot_h)
    for index, line in enumerate(band_lines):
        parts.append(f'<text x="16" y="{top + plot_h + 40 + 16 * index}">{html.escape(line)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _rate_chart(number: int, timeline: Mapping[str, Any]) -> str:
    """Sends and acks per second, and the ack latency (median and worst), over the same time axis."""
    buckets, bucket_s, duration = timeline["buckets"], timeline["bucket_s"], timeline["duration"]
    left, plot_h, gap, top = 70, 110, 50, 24
    width, height = left + PLOT_W + 110, top + 2 * plot_h + gap + 30
    rates = [(b["sends"] / bucket_s, b["acks"] / bucket_s) for b in buckets]
    peak_rate = max([1.0, *(max(pair) for pair in rates)])
    latencies = [b["latency_max_ms"] for b in buckets if b["latency_max_ms"] is not None]
    peak_ms = max([1.0, *latencies])
    parts = [_svg_open(f"rates-{number}", width, height)]
    for y0, heading in ((top, "messages per second"), (top + plot_h + gap, "ack latency (ms)")):
        parts += _fault_bands(timeline, left, y0, plot_h)
        parts.append(f'<text x="{left}" y="{y0 - 8}">{heading}</text>')
        parts += _x_axis(duration, left, y0 + plot_h)

    def line(values: list[float | None], y0: float, peak: float, color: str, name: str, row: int) -> None:
        points = [
            f"{left + PLOT_W * (bucket['start'] + bucket_s / 2) / duration:.1f},"
            f"{y0 + plot_h - plot_h * value / peak:.1f}"
            for bucket, value in zip(buckets, values, strict=True)
            if value is not None
        ]
        if points:
            parts.append(
                f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="1.5"/>'
            )
        parts.append(
            f'<rect x="{left + PLOT_W + 10}" y="{y0 + 14 * row}" width="10" height="10" fill="{color}"/>'
            f'<text x="{left + PLOT_W + 24}" y="{y0 + 14 * row + 9}">{name}</text>'
        )

    line([s for s, _a in rates], top, peak_rate, "#1f77b4", "sends", 0)
    line([a for _s, a in rates], top, peak_rate, "#2ca02c", "acks", 1)
    low = top + plot_h + gap
    line([b["latency_p50_ms"] for b in buckets], low, peak_ms, "#ff7f0e", "median", 0)
    line([b["latency_max_ms"] for b in buckets], low, peak_ms, "#d62728", "worst", 1)
    for y0, peak in ((top, peak_rate), (low, peak_ms)):
        parts.append(f'<text x="{left - 8}" y="{y0 + 10}" text-anchor="end">{peak:.0f}</text>')
        parts.append(f'<text x="{left - 8}" y="{y0 + plot_h}" text-anchor="end">0</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _run_section(number: int, run: Run) -> str:
    parts = [f"<h2>#{number} {html.escape(label(run))}</h2>"]
    timeline = run.get("timeline")
    if timeline and timeline.get("lanes"):
        parts += [_timeline_chart(number, timeline), _rate_chart(number, timeline)]
    if run.get("injected"):
        items = "".join(f"<li>{html.escape(str(line))}</li>" for line in run["injected"])
        parts.append(f"<details><summary>Faults as injected</summary><ul>{items}</ul></details>")
    parts.append(_anomalies(run))
    return "\n".join(parts)


def _anomalies(run: Run) -> str:
    anomalies = run["anomalies"]
    if not anomalies:
        return "<p>No anomaly found.</p>"
    parts = []
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for anomaly in anomalies:
        by_kind.setdefault(anomaly["kind"], []).append(anomaly)
    for kind, found in by_kind.items():
        parts.append(f"<h3>{html.escape(kind)}: {len(found)}</h3>")
        parts.append(f'<p class="explain">{html.escape(EXPLANATIONS.get(kind, ""))}</p>')
        items = "".join(
            f"<li>{html.escape(_anomaly_line(anomaly))}</li>" for anomaly in found[:SHOWN_ANOMALIES]
        )
        more = len(found) - SHOWN_ANOMALIES
        tail = f"<li>... and {more} more</li>" if more > 0 else ""
        parts.append(f"<ul>{items}{tail}</ul>")
        for anomaly in [anomaly for anomaly in found if anomaly.get("history")][:HISTORIES_PER_KIND]:
            parts.append(_history_table(anomaly))
    return "\n".join(parts)


def _anomaly_line(anomaly: Mapping[str, Any]) -> str:
    where = ", ".join(
        f"{o['topic']} partition {o['partition']} offset {o['offset']}" for o in anomaly["offsets"]
    )
    return f"{', '.join(anomaly['values'])}" + (f" at {where}" if where else "") + f": {anomaly['detail']}"


def _history_table(anomaly: Mapping[str, Any]) -> str:
    rows = "".join(
        f'<tr class="{"touches" if op["touches"] else ""}">'
        + _cells([f"{op['at']:.3f} s", op["process"], op["op"]], text_columns=3)
        + "</tr>"
        for op in anomaly["history"]
    )
    values = ", ".join(anomaly["values"])
    return (
        f"<p>History around {html.escape(values)} (highlighted: the operations that touch it):</p>"
        "<table class=history>"
        f"<tr>{_cells(['time', 'process', 'operation'], header=True, text_columns=3)}</tr>"
        f"{rows}</table>"
    )
