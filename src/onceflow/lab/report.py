"""Reports of lab runs: rich tables that fit 80 columns, JSON, and a self-contained HTML page
after Jepsen's: at a glance, the verdicts; then the matrix as a grid of failures against
guarantees, the broker table with each row's writes on the timeline of its fault, the runs and
their anomalies as labelled bars, the preconditions each run created, and per run its evidence,
a timeline with the faults as shaded bands, sends and ack latency over time, and each anomaly
explained with the history operations around it.

Every function takes runs as plain dicts, in the shape of `RunResult.to_json()`: the keys
guarantee, faults, produced, acknowledged, delivered, lost, duplicated, aborted_reads and
anomalies, and for lab runs coverage, verdicts, cross_check, control, transactions and timeline.
A count whose verdict is "not tested" (the run never created the anomaly's preconditions) is shown
as such, never as a clean 0. Counts are of distinct units (`unit`: a lab run's values, a pipeline
run's payments), so a column means one thing, and a run's section repeats its table's numbers.
Every table cell holds text for people (`human`), never JSON.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from onceflow.lab import charts, controls, promises

Run = Mapping[str, Any]
COUNTS = ("produced", "acknowledged", "delivered", "lost", "duplicated", "aborted_reads")
# The anomalies the table counts: key, name, colour.
SERIES = (
    ("lost", "lost", "#d62728"),
    ("duplicated", "duplicated", "#ff7f0e"),
    ("aborted_reads", "aborted reads", "#9467bd"),
)
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
HTML_HEADERS = {"delivered": "delivered", "duplicated": "duplicated", "aborted_reads": "aborted reads"}
# The table's columns of anomalies, and the checker's kinds each one counts.
GROUPS = (
    ("lost", "Lost", ("lost-write", "lost-downstream")),
    ("duplicated", "Duplicated", ("duplicate",)),
    ("aborted_reads", "Aborted reads", ("aborted-read",)),
)
# What each anomaly kind means, for the reader of the report.
EXPLANATIONS = {
    "lost-write": "The producer was told this value was stored, yet the final read_committed read of"
    " the input does not hold it: an acknowledged write was lost.",
    "lost-downstream": "The value reached the input but never the output: a worker moved its"
    " committed offset past it without writing its result (at-most-once commits first).",
    "duplicate": "The value is stored more than once: a send retried after its ack was lost, sent"
    " again by a restarted producer, or records processed again by a worker that crashed before it"
    " committed.",
    "aborted-read": "A read_committed reader saw (or passed on) a record of a transaction its producer"
    " saw aborted (or never asked to commit), which it must skip.",
    "inconsistent-offset": "One offset held different values in different reads: the log was"
    " rewritten under its readers.",
    "non-monotonic-poll": "A consumer polled an offset at or before one it had already polled,"
    " without a new assignment in between.",
    "skipping-poll": "A consumer jumped over records its isolation level could read.",
    "wrong-balance": "The database balance differs from the exact sum of the committed payments.",
}
UNITS_NOTE = (
    "Every count is of distinct units, named in the unit column: a lab run's values, each sent once"
    " (or sent again by a restarted producer), or a pipeline run's payments, whose order-status and"
    " seat records count once together. Duplicated: units stored more than once; aborted reads:"
    " units of aborted transactions that a read_committed reader saw or passed on."
)


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


def stage_label(run: Run) -> str:
    return (f"{run['stage']}: " if "stage" in run else "") + label(run)


def untested(run: Run, key: str) -> bool:
    return bool(run.get("verdicts", {}).get(key) == NOT_TESTED)


def coverage_text(run: Run) -> str:
    """The counters that are not zero, e.g. "aborted records 20, acks lost 3"."""
    counts = run.get("coverage") or {}
    return ", ".join(f"{name.replace('_', ' ')} {count}" for name, count in counts.items() if count)


def anomalies_text(run: Run) -> str:
    kinds: dict[str, int] = {}
    for anomaly in run["anomalies"]:
        kinds[anomaly["kind"]] = kinds.get(anomaly["kind"], 0) + 1
    return ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())) or "none"


def cross_check_text(run: Run) -> str | None:
    """Whether the broker's own reads agree with the history on which records were aborted."""
    agreement = run.get("cross_check")
    if not agreement:
        return None
    if not agreement["compared"]:
        return "the log agrees with the history: no transactional records to compare"
    if agreement["agrees"]:
        return f"the log agrees with the history: yes ({agreement['compared']} transactional records)"
    return (
        f"the log agrees with the history: NO, {agreement['differ']} of {agreement['compared']}"
        f" transactional records differ (e.g. {agreement['examples'][0]})"
    )


def problems(runs: Sequence[Run]) -> list[str]:
    """What fails a lab run: a broken promise, an anomaly not tested, a broker fault missed."""
    found = []
    for run in runs:
        name = stage_label(run)
        found += [f"{name}: broken promise: {promise}" for promise in promises.broken(run)]
        untested_ones = [
            anomaly for anomaly, verdict in run.get("verdicts", {}).items() if verdict == NOT_TESTED
        ]
        if untested_ones:
            found.append(
                f"{name}: {', '.join(untested_ones)} not tested: the faults never created their preconditions"
            )
        control = run.get("control")
        if control and control["verdict"] == controls.MISSED:
            found.append(f"{name}: {controls.line(control)}")
    return found


def evidence(run: Run) -> list[str]:
    """What a run shows of the mechanism at work, from its history and its fault injector."""
    counts, found = run.get("coverage") or {}, []
    transactions = run.get("transactions") or {}
    if transactions.get("committed") or transactions.get("aborted"):
        found.append(
            f"{transactions.get('committed', 0)} transactions committed, {transactions.get('aborted', 0)}"
            f" aborted on purpose, {transactions.get('fenced', 0)} fenced,"
            f" {transactions.get('left open', 0)} left open by a client that died"
        )
    if counts.get("aborted_records") and "aborted_reads" in run.get("verdicts", {}):
        found.append(
            f"read_committed readers read past {counts['aborted_records']} records of transactions"
            f" their clients saw aborted, and returned {'some' if run['aborted_reads'] else 'none'}"
        )
    producer = run["guarantee"] in ("idempotent", "exactly-once")
    if counts.get("acks_lost") and producer and not run["duplicated"]:
        found.append(
            f"{counts['acks_lost']} answers to writes destroyed after the broker acted: the retries of"
            " each producer session were stored once (its sequence numbers)"
        )
    if counts.get("resent_by_new_session"):
        outcome = (
            "stored again: a new producer id"
            if run["duplicated"]
            else "stored once: their earlier copies were aborted with their producer's transaction"
        )
        found.append(
            f"{counts['resent_by_new_session']} values sent again by a restarted producer, {outcome}"
        )
    if counts.get("zombies_resumed"):
        fenced = transactions.get("fenced", 0)
        found.append(f"{counts['zombies_resumed']} zombie workers resumed; {fenced} transactions fenced")
    if run.get("balances_match"):
        found.append("the database balances equal the exact sums of the committed payments")
    return found


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
        notes = [f"counts in {run.get('unit', 'values')}"]
        if "coverage" in run:
            notes.append(f"coverage: {coverage_text(run) or '[yellow]none[/]'}")
        if run.get("balances_match") is not None:
            notes.append(
                "balances: " + ("[green]exact[/]" if run["balances_match"] else "[bold red]wrong[/]")
            )
        shown = anomalies_text(run)
        notes.append(f"findings: {'[green]none[/]' if shown == 'none' else shown}")
        if agreement := cross_check_text(run):
            notes.append(agreement)
        console.print(f"  #{number} " + "; ".join(notes), highlight=False)
    if any(untested(run, key) for run in runs for key in COUNTS):
        console.print(f"  {NOT_TESTED_NOTE}", highlight=False)


def breaks(run: Run, key: str) -> bool:
    """Whether the run's count of `key` breaks a "never" of its guarantee."""
    if not run[key] or run["guarantee"] not in promises.PREDICTIONS:
        return False
    return promises.predict(run["guarantee"], run["faults"]).get(key) == promises.NEVER


def _count_cell(run: Run, key: str) -> str:
    if untested(run, key):
        return "[yellow]n/t[/]"
    value = run[key]
    if key in ("lost", "duplicated", "aborted_reads") and value > 0:
        return f"[bold red]{value}[/]" if breaks(run, key) else f"[yellow]{value}[/]"
    return str(value)


def write_json(runs: Sequence[Run], path: Path) -> None:
    path.write_text(json.dumps({"runs": list(runs)}, indent=2) + "\n", encoding="utf-8")


def write_html(
    runs: Sequence[Run],
    path: Path,
    title: str = "onceflow delivery-semantics lab",
    matrix: Sequence[Mapping[str, Any]] = (),
    broker_table: Sequence[Mapping[str, Any]] = (),
    notes: Sequence[str] = (),
) -> None:
    path.write_text(render_html(runs, title, matrix, broker_table, notes), encoding="utf-8")


def render_html(
    runs: Sequence[Run],
    title: str = "onceflow delivery-semantics lab",
    matrix: Sequence[Mapping[str, Any]] = (),
    broker_table: Sequence[Mapping[str, Any]] = (),
    notes: Sequence[str] = (),
) -> str:
    """One page, no external resources: the charts are inline SVG, the styles and script inline.
    `notes`: lines for the top of the page (the demo's failed stages)."""
    sections = [_glance(runs, matrix, broker_table, notes), _matrix_grid(matrix, runs)]
    sections.append(_broker_table(broker_table))
    if runs:
        sections += [
            '<h2 id="runs">Runs</h2>',
            f'<p class="explain">{html.escape(UNITS_NOTE)}</p>',
            _runs_table(runs),
            _summary_chart(runs),
            _coverage_table(runs),
            *(_run_section(number, run) for number, run in enumerate(runs, 1)),
        ]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; background: #fff; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; vertical-align: top; }}
td.text, th.text {{ text-align: left; }}
table.broker td.text {{ overflow-wrap: anywhere; }}
table.broker td:first-child {{ white-space: nowrap; }}
td.bad, span.bad {{ color: #d62728; font-weight: bold; }}
td.untested, span.untested {{ color: #b8860b; font-style: italic; }}
td.good {{ color: #2ca02c; }}
td.found {{ color: #a05a00; }}
table.grid td, table.grid th {{ text-align: left; min-width: 9em; }}
table.grid td.agrees {{ background: #eaf6ea; }}
table.grid td.disagrees {{ background: #fbe3e3; }}
table.grid td.untested {{ background: #fdf6e0; }}
table.grid td.absent {{ color: #888; }}
tr.touches td {{ background: #fff3cd; }}
table.history td:nth-child(-n+2) {{ white-space: nowrap; }}
svg {{ display: block; margin: 0.5em 0; overflow: hidden; max-width: 100%; height: auto; }}
svg text {{ font-family: sans-serif; font-size: {charts.FONT_PX}px; fill: #222; }}
p.explain, ul.glance {{ max-width: 70em; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
{"".join(section for section in sections if section)}
<script>
{SELF_CHECK}
</script>
</body></html>
"""


# The page checks itself once rendered (tests read the title back through headless Chromium): every
# SVG label lies inside its drawing, nothing is wider than the window, no table cell holds JSON,
# every run's section and bar group has its label, and the summary chart has its bars.
SELF_CHECK = r"""
(function () {
  const problems = [];
  const page = document.documentElement.clientWidth;
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
  for (const element of document.querySelectorAll("body *")) {
    if (element.getBoundingClientRect().right > page + 0.5) {
      problems.push("wider than the page: " + (element.id || element.tagName.toLowerCase()));
      break;
    }
  }
  if (document.documentElement.scrollWidth > page + 0.5) problems.push("the page scrolls sideways");
  const json = /^(null|undefined|NaN|true|false|None|\[[\s\S]*\]|\{[\s\S]*\}|"[\s\S]*")$/;
  for (const cell of document.querySelectorAll("td, th")) {
    const text = cell.textContent.trim();
    if (json.test(text)) problems.push("raw JSON in a cell: " + text);
  }
  const sections = document.querySelectorAll("section.run");
  sections.forEach(function (section, index) {
    const heading = section.querySelector("h2");
    if (!heading || !heading.textContent.startsWith("#" + (index + 1) + " ") ||
        heading.textContent.trim().length < 4) problems.push("a run without a label: #" + (index + 1));
  });
  for (const group of document.querySelectorAll("svg#chart g.run")) {
    const text = group.querySelector("text.run-label");
    if (!text || !text.textContent.trim()) problems.push("a bar group without a label");
  }
  if (sections.length && document.querySelectorAll("svg#chart rect.bar").length === 0) {
    problems.push("chart missing");
  }
  document.title = problems.length ? "report broken: " + problems.slice(0, 3).join("; ") : "report ok";
})();
"""


def _cells(values: Sequence[str], header: bool = False, text_columns: int = 1) -> str:
    tag = "th" if header else "td"
    return "".join(
        f"<{tag}{' class=text' if index < text_columns else ''}>{html.escape(value)}</{tag}>"
        for index, value in enumerate(values)
    )


def _glance(
    runs: Sequence[Run],
    matrix: Sequence[Mapping[str, Any]],
    broker_table: Sequence[Mapping[str, Any]],
    notes: Sequence[str],
) -> str:
    """The verdicts first: what failed, what the negative controls caught, what agrees."""
    items = [f'<li class="bad">{html.escape(note)}</li>' for note in notes]
    broken = [(number, promise) for number, run in enumerate(runs, 1) for promise in promises.broken(run)]
    items += [
        f'<li class="bad">#{number} broken promise: {html.escape(text)}</li>' for number, text in broken
    ]
    untested_ones = [
        f"#{number} {', '.join(key.replace('_', ' ') for key in COUNTS if untested(run, key))}"
        for number, run in enumerate(runs, 1)
        if any(untested(run, key) for key in COUNTS)
    ]
    if runs and not broken:
        items.append(f"<li>{len(runs)} runs: no promise broken</li>")
    if untested_ones:
        items.append(
            '<li><span class="untested">not tested</span> (the run never created the preconditions):'
            f" {html.escape('; '.join(untested_ones))}</li>"
        )
    for number, run in enumerate(runs, 1):
        control = run.get("control")
        if control:
            css = ' class="bad"' if control["verdict"] == controls.MISSED else ""
            items.append(f"<li{css}>#{number} {html.escape(controls.line(control))}</li>")
        agreement = run.get("cross_check")
        if agreement and not agreement["agrees"]:
            items.append(f"<li>#{number} {html.escape(cross_check_text(run) or '')}</li>")
    if matrix:
        kept = sum(row["agrees"] is True for row in matrix)
        none = sum(row["agrees"] is None for row in matrix)
        text = f"matrix: {kept} of {len(matrix)} cells kept every promise and tested one"
        items.append(f"<li>{text}" + (f", {none} tested none" if none else "") + "</li>")
    if broker_table:
        agree = sum(row["verdict"] == "agrees" for row in broker_table)
        items.append(
            f"<li>broker table: {agree} of {len(broker_table)} rows agree with the documents' prediction</li>"
        )
    if not items:
        return ""
    return f'<h2 id="glance">At a glance</h2><ul class="glance">{"".join(items)}</ul>'


def unpromised(run: Run, key: str) -> bool:
    """A lab run's anomaly its guarantee promises nothing of: read_uncommitted readers, and what they
    pass on, may hold aborted data."""
    return "verdicts" in run and key not in promises.predict(run["guarantee"], run["faults"])


def _html_count(run: Run, key: str) -> str:
    if untested(run, key):
        return f'<td class="untested">{NOT_TESTED}</td>'
    if key == "aborted_reads" and unpromised(run, key):
        return f'<td class="text">{f"{run[key]}, " if run[key] else ""}no promise</td>'
    value = run[key]
    found = key in ("lost", "duplicated", "aborted_reads") and value > 0
    css = "bad" if found and breaks(run, key) else "found" if found else ""
    return f'<td class="{css}">{html.escape(human(value))}</td>'


def _runs_table(runs: Sequence[Run]) -> str:
    names = ["#", "run", "unit", *(HTML_HEADERS.get(key, HEADERS[key]) for key in COUNTS), "checks"]
    rows = []
    for number, run in enumerate(runs, 1):
        cells = f'<td><a href="#run-{number}">{number}</a></td>'
        cells += f"<td class=text>{html.escape(stage_label(run))}</td>"
        cells += _cells([run.get("unit", "values")])
        cells += "".join(_html_count(run, key) for key in COUNTS)
        rows.append(f"<tr>{cells}{_checks_cell(run)}</tr>")
    head = _cells(names[:-1], header=True, text_columns=3) + "<th class=text>checks</th>"
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _checks_cell(run: Run) -> str:
    """The run's other checks in one cell: the cross-check, the drain, the balances, its seed."""
    checks, bad = [], False
    agreement = run.get("cross_check")
    if agreement and agreement["compared"]:
        checks.append(
            "log agrees with history" if agreement["agrees"] else f"log differs: {agreement['differ']}"
        )
        bad |= not agreement["agrees"]
    if run.get("drained") is False:
        checks.append("not drained")
        bad = True
    if run.get("balances_match") is not None:
        checks.append("balances " + ("exact" if run["balances_match"] else "wrong"))
        bad |= not run["balances_match"]
    checks.append(f"seed {human(run.get('seed'))}")
    return f'<td class="text{" bad" if bad else ""}">{html.escape("; ".join(checks))}</td>'


def _coverage_table(runs: Sequence[Run]) -> str:
    covered = [(number, run) for number, run in enumerate(runs, 1) if "coverage" in run]
    if not covered:
        return ""
    head = ["#", "preconditions the run created (counted from its history and its fault injector)"]
    head += ["lost", "duplicated", "aborted reads"]
    rows = []
    for number, run in covered:
        verdicts = run.get("verdicts", {})
        cells = [str(number), coverage_text(run) or "none"]
        cells += [verdicts.get(key, "no promise") for key in ("lost", "duplicated", "aborted_reads")]
        rows.append(f"<tr>{_cells(cells, text_columns=5)}</tr>")
    return (
        '<h2 id="coverage">Coverage: the preconditions each run created</h2>'
        '<p class="explain">A check that found nothing proves something only if the run gave it a chance to'
        " fail: clean means looked for with its preconditions present, not tested that they never were.</p>"
        f"<table><tr>{_cells(head, header=True, text_columns=5)}</tr>{''.join(rows)}</table>"
    )


def _matrix_grid(rows: Sequence[Mapping[str, Any]], runs: Sequence[Run]) -> str:
    """Failures down, guarantees across; a cell holds each anomaly's count beside its prediction
    and the run it comes from, coloured by whether the promises hold."""
    if not rows:
        return ""
    guarantees = [name for name in promises.PREDICTIONS if any(row["guarantee"] == name for row in rows)]
    failures = list(dict.fromkeys((row["failure"], row["title"]) for row in rows))
    by_cell = {(row["failure"], row["guarantee"]): row for row in rows}
    body = []
    for key, title in failures:
        cells = f'<th class="text">{html.escape(key)}: {html.escape(title)}</th>'
        for guarantee in guarantees:
            row = by_cell.get((key, guarantee))
            cells += _grid_cell(row, runs) if row else '<td class="absent">not run</td>'
        body.append(f"<tr>{cells}</tr>")
    notes = {row["why_may"] for row in rows if row.get("why_may")}
    footnotes = "".join(f'<p class="explain">idempotent, "may": {html.escape(note)}.</p>' for note in notes)
    head = "".join(f"<th>{html.escape(guarantee)}</th>" for guarantee in guarantees)
    return (
        '<h2 id="matrix">Matrix: each failure alone against each guarantee</h2>'
        '<p class="explain">A cell is one run: each anomaly\'s count beside its prediction. <em>never</em> is'
        " a promise the count must keep (0); <em>may</em> allows any count; <em>not tested</em>: the run"
        " never created the anomaly's preconditions. Green: every promise kept and one tested; red: one"
        " broken; yellow: none tested.</p>"
        f'<table class="grid"><tr><th class="text">failure</th>{head}</tr>{"".join(body)}</table>{footnotes}'
    )


def _grid_cell(row: Mapping[str, Any], runs: Sequence[Run]) -> str:
    lines = []
    for anomaly, cell in row["cells"].items():
        name = dict((key, text) for key, text, _colour in SERIES)[anomaly]
        if cell["measured"] is None:
            lines.append(f'<span class="untested">{name}: {NOT_TESTED}</span> ({cell["predicted"]})')
        elif cell["agrees"] is False:
            lines.append(f'<span class="bad">{name}: {cell["measured"]}</span> ({cell["predicted"]}): broken')
        else:
            lines.append(f"{name}: {cell['measured']} ({cell['predicted']})")
    number = next((index for index, run in enumerate(runs, 1) if run is row["run"]), None)
    if number is not None:
        lines.append(f'<a href="#run-{number}">run #{number}</a>')
    css = "agrees" if row["agrees"] else "disagrees" if row["agrees"] is False else "untested"
    return f'<td class="{css}">{"<br>".join(lines)}</td>'


def _broker_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The documents' broker half: a row per setting, what the writes during the fault became,
    and the row's writes drawn on the timeline of its fault."""
    if not rows:
        return ""
    head = ["row", "settings", "predicted: the rule", "during the fault (values)", "lost (values)", "agrees"]
    body = []
    for row in rows:
        verdict = {"agrees": ("good", "yes"), "disagrees": ("bad", "NO")}.get(row["verdict"])
        css, text = verdict or ("untested", f"not tested: {row.get('not_tested_because')}")
        refused = row.get("refused_during_fault", 0)
        during = (
            f"{row['sent_during_fault']} sent, {row['acknowledged_during_fault']} acknowledged,"
            f" {refused} refused" + (" with NOT_ENOUGH_REPLICAS" if refused else "")
        )
        predicted = f"{row['prediction']}: {row['rule']}"
        cells = _cells([row["row"], row["settings"], predicted, during], text_columns=4)
        lost_css = "" if not row["lost"] else "found" if row["prediction"] == "may lose" else "bad"
        lost = f'<td class="{lost_css}">{row["lost"]}</td>'
        body.append(f'<tr>{cells}{lost}<td class="{css}">{html.escape(text)}</td></tr>')
    pictures = []
    for index, row in enumerate(rows, 1):
        attempt = f" (attempt {row['attempts']})" if row.get("attempts", 1) > 1 else ""
        pictures.append(f"<h3>{html.escape(row['row'])}: {html.escape(row['settings'])}{attempt}</h3>")
        if row.get("picture", {}).get("marks"):
            pictures.append(charts.broker_row_chart(index, row["picture"]))
        if row["lost_values"]:
            pictures.append(f"<p>lost: {html.escape(', '.join(row['lost_values']))}</p>")
    return (
        '<h2 id="broker-table">Broker table: acks, min.insync.replicas and leader election under broker'
        " faults</h2>"
        '<p class="explain">ZooKeeper and three brokers, a topic per row with three replicas led by broker 1;'
        " values written one by one, each acknowledged value read back after the faults or reported lost."
        " acks=1 may lose what only the dead leader had; acks=all with min.insync.replicas=2 never loses,"
        " and with one replica left in sync is refused; an unclean election may lose, a clean one never"
        " does.</p>"
        f'<table class="broker"><tr>{_cells(head, header=True, text_columns=4)}</tr>{"".join(body)}</table>'
        + "\n".join(pictures)
    )


def _summary_chart(runs: Sequence[Run]) -> str:
    """Lost, duplicated and aborted reads per run, each group labelled with its run."""
    groups = []
    for number, run in enumerate(runs, 1):
        bars: list[charts.Bar] = []
        for key, name, colour in SERIES:
            if untested(run, key):
                bars.append((name, None, colour, NOT_TESTED))
            elif key == "aborted_reads" and unpromised(run, key):
                found = f"{run[key]}, " if run[key] else ""
                bars.append((name, None, colour, f"{found}no promise (reads uncommitted)"))
            else:
                bars.append((name, int(run[key]), colour, ""))
        unit = run.get("unit", "values")
        groups.append((f"#{number} {stage_label(run)} ({unit})", bars))
    return '<h3 id="anomalies">Anomalies per run</h3>' + charts.summary_chart(groups)


def _run_section(number: int, run: Run) -> str:
    parts = [f'<section class="run" id="run-{number}"><h2>#{number} {html.escape(stage_label(run))}</h2>']
    broken = promises.broken(run)
    if broken:
        items = "".join(f"<li>{html.escape(promise)}</li>" for promise in broken)
        parts.append(f'<ul class="bad">{items}</ul>')
    control = run.get("control")
    if control:
        parts.append(f"<p><strong>{html.escape(controls.line(control))}</strong></p>")
    if agreement := cross_check_text(run):
        parts.append(f"<p>{html.escape(agreement)}</p>")
    timeline = run.get("timeline")
    if timeline and timeline.get("lanes"):
        parts.append(charts.timeline_chart(number, timeline))
        if any(bucket["sends"] for bucket in timeline.get("buckets", [])):
            parts.append(charts.rate_chart(number, timeline))
    if run.get("injected"):
        items = "".join(f"<li>{html.escape(str(line))}</li>" for line in run["injected"])
        parts.append(f"<details><summary>Faults as injected</summary><ul>{items}</ul></details>")
    parts.append(_anomalies(run))
    parts.append("</section>")
    return "\n".join(parts)


def _anomalies(run: Run) -> str:
    """The anomalies under the table's columns, with the same counts, then any other kind."""
    unit = run.get("unit", "values")
    found = evidence(run)
    parts = []
    if not run["anomalies"]:
        parts.append("<p>No anomaly found.</p>")
    if found:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in found)
        parts.append(f"<p>The mechanism at work:</p><ul>{items}</ul>")
    grouped: set[str] = set()
    for key, title, kinds in GROUPS:
        members = [anomaly for anomaly in run["anomalies"] if anomaly["kind"] in kinds]
        grouped.update(kinds)
        if not members:
            continue
        split = ", ".join(
            f"{kind} {sum(a['kind'] == kind for a in members)}"
            for kind in kinds
            if any(a["kind"] == kind for a in members)
        )
        parts.append(f"<h3>{title}: {run[key]} {unit} ({len(members)} findings: {html.escape(split)})</h3>")
        parts += _kind_details(kinds, members)
    others = [anomaly for anomaly in run["anomalies"] if anomaly["kind"] not in grouped]
    for kind in dict.fromkeys(anomaly["kind"] for anomaly in others):
        members = [anomaly for anomaly in others if anomaly["kind"] == kind]
        parts.append(f"<h3>{html.escape(kind)}: {len(members)} findings</h3>")
        parts += _kind_details((kind,), members)
    return "\n".join(parts)


def _kind_details(kinds: Sequence[str], members: Sequence[Mapping[str, Any]]) -> list[str]:
    parts = []
    for kind in kinds:
        of_kind = [anomaly for anomaly in members if anomaly["kind"] == kind]
        if not of_kind:
            continue
        meaning = html.escape(EXPLANATIONS.get(kind, ""))
        parts.append(f'<p class="explain"><strong>{html.escape(kind)}</strong>: {meaning}</p>')
        items = "".join(
            f"<li>{html.escape(_anomaly_line(anomaly))}</li>" for anomaly in of_kind[:SHOWN_ANOMALIES]
        )
        more = len(of_kind) - SHOWN_ANOMALIES
        tail = f"<li>... and {more} more</li>" if more > 0 else ""
        parts.append(f"<ul>{items}{tail}</ul>")
        for anomaly in [anomaly for anomaly in of_kind if anomaly.get("history")][:HISTORIES_PER_KIND]:
            parts.append(_history_table(anomaly))
    return parts


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
