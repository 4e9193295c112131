"""The lab's reports from a made-up history: the timeline, the operations around an anomaly, tables
that fit 80 columns, and an HTML page whose cells hold text, whose labels fit, which fits a 1,400 px
window and says the same counts in its table and its sections, checked by the page itself in
headless Chromium (with broken pages as negative controls)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from onceflow.lab import broker_table, matrix, promises, timeline
from onceflow.lab.history import Event
from onceflow.lab.report import human, print_table, render_html, write_html
from tests.lab.chromium import chromium, needs_chromium, rendered_title

T0 = 1_700_000_000.0
FAULTS = ["lost-acks", "producer-crash", "consumer-crash", "zombie-consumer"]


def _history() -> list[Event]:
    def event(at: float, process: str, type_: str, **fields: Any) -> Event:
        return {"time": T0 + at, "process": process, "type": type_, **fields}

    events = [
        event(0.0, "lab", "fault", action="lose-acks", target=0),
        event(4.0, "lab", "fault", action="stop-losing-acks", target=0),
        event(2.0, "lab", "fault", action="kill-producer", target=0),
        event(0.9, "worker-0.0", "assign", topic="in", partitions=[0, 1]),
    ]
    for n in range(20):
        process = "producer-0.0" if n < 10 else "producer-0.1"
        at = 0.1 + n * 0.3 + (0.5 if n >= 10 else 0)
        events.append(event(at, process, "send", topic="in", value=f"p-0-{n}"))
        events.append(event(at + 0.05, process, "ack", topic="in", value=f"p-0-{n}", partition=0, offset=n))
    events.append(event(3.05, "producer-0.0", "crash", point="before-commit"))
    events.append(event(1.2, "worker-0.0", "poll", topic="in", isolation="read_committed",
                        records=[[0, 3, "p-0-3"], [0, 4, "p-0-4"]]))  # fmt: skip
    events.append(
        event(7.0, "final-read", "read", topic="in", isolation="read_committed", records=[], ends=[])
    )
    return events


def _run(guarantee: str = "exactly-once", **changes: Any) -> dict[str, Any]:
    events = _history()
    run: dict[str, Any] = {
        "guarantee": guarantee,
        "faults": FAULTS,
        "broker_fault": None,
        "seed": 7,
        "produced": 300,
        "acknowledged": 297,
        "delivered": 296,
        "lost": 1,
        "duplicated": 0,
        "aborted_reads": 0,
        "drained": True,
        "injected": ["0.3s lose-acks", "2.0s SIGKILL producer-0.0 at its next crash point"],
        "unit": "values",
        "cross_check": {"agrees": True, "compared": 40, "differ": 0, "examples": []},
        "control": None,
        "transactions": {"committed": 30, "aborted": 8, "fenced": 1, "unknown": 0, "left open": 2},
        "coverage": {"aborted_records": 12, "acks_lost": 3, "zombies_resumed": 0},
        "verdicts": {"lost": "found", "duplicated": "not tested", "aborted_reads": "clean"},
        "timeline": timeline.build(events),
        "anomalies": [
            {
                "kind": "lost-write",
                "values": ["p-0-3"],
                "offsets": [{"topic": "in", "partition": 0, "offset": 3}],
                "detail": "acknowledged, but not in the final read_committed read",
                "history": timeline.context(events, ["p-0-3"]),
            }
        ],
    }
    return {**run, **changes}


def _matrix_rows(failures: int = 2) -> list[dict[str, Any]]:
    rows = []
    for failure in matrix.FAILURES[:failures]:
        for guarantee in promises.PREDICTIONS:
            if not matrix.applies(failure, guarantee):
                continue
            predicted = promises.predict(guarantee, failure.faults)
            cells = {
                name: {"predicted": prediction, "measured": None if name == "duplicated" else 0,
                       "verdict": "clean", "agrees": None if name == "duplicated" else True}
                for name, prediction in predicted.items()
            }  # fmt: skip
            run = _run(guarantee, faults=list(failure.faults))
            row = {"failure": failure.key, "title": failure.title, "guarantee": guarantee}
            row |= {"why_may": promises.why_may(guarantee, failure.faults)}
            rows.append({**row, "faults": list(failure.faults), "cells": cells, "agrees": True, "run": run})
    return rows


def _broker_history(row: broker_table.Row) -> list[Event]:
    """Writes before and during the row's fault, the fault's steps and the read-back, each write
    faring as the row predicts: refused, acknowledged and lost, or acknowledged and kept."""
    events: list[Event] = []

    def event(at: float, type_: str, **fields: Any) -> None:
        events.append({"time": T0 + at, "process": "producer", "type": type_, "topic": row.topic, **fields})

    kept = [f"before-{n}" for n in range(3)]
    for offset, value in enumerate(kept):
        event(0.1 * offset, "send", value=value)
        event(0.1 * offset + 0.02, "ack", value=value, partition=0, offset=offset)
    event(0.5, "fault", action="followers-stopped")
    for number in range(5):
        value = f"during-{number}"
        event(0.6 + 0.1 * number, "send", value=value)
        if row.prediction == broker_table.REFUSES:
            event(0.62 + 0.1 * number, "fail", value=value, error="NOT_ENOUGH_REPLICAS")
        elif row.needs_acknowledged_during_fault:
            event(0.62 + 0.1 * number, "ack", value=value, partition=0, offset=3 + number)
            kept += [] if row.prediction == broker_table.MAY_LOSE else [value]
    event(1.4, "fault", action="leader-killed")
    event(2.0, "fault", action="followers-resumed")
    event(3.0, "fault", action="leader-restarted")
    records = [[0, offset, value] for offset, value in enumerate(kept)]
    event(3.2, "read", isolation="read_committed", records=records, ends=[[0, len(kept)]])
    return events


def _broker_rows() -> list[dict[str, Any]]:
    """Every row of the broker table, judged on made-up histories (`_broker_history`)."""
    judged = []
    for row in broker_table.rows_to_run():
        row.history = _broker_history(row)
        row.sent_during_fault = 5
        refuses = row.prediction == broker_table.REFUSES
        row.acknowledged_during_fault = 5 if row.needs_acknowledged_during_fault and not refuses else 0
        row.refused_during_fault = 5 if refuses else 0
        judged.append({**row.to_json(), "attempts": 1})
    return judged


def test_the_timeline_has_fault_bands_lanes_and_rates() -> None:
    built = timeline.build(_history())
    assert built["duration"] == pytest.approx(6.35, abs=0.01)  # the final read is left out
    bands = {band["label"]: (band["start"], band["end"]) for band in built["bands"]}
    assert bands["lost acks"] == (0.0, 4.0)
    # A killed producer's band lasts until its next incarnation came up.
    assert bands["producer-0 killed"] == pytest.approx((2.0, 3.6))
    lanes = {lane["name"]: lane["spans"] for lane in built["lanes"]}
    assert [span["replaced"] for span in lanes["producer-0"]] == [True, False]
    assert sum(bucket["sends"] for bucket in built["buckets"]) == 20
    assert sum(bucket["acks"] for bucket in built["buckets"]) == 20
    latencies = [bucket["latency_p50_ms"] for bucket in built["buckets"] if bucket["latency_p50_ms"]]
    assert latencies and all(latency == pytest.approx(50, abs=1) for latency in latencies)


def test_the_history_around_an_anomaly_shows_its_operations_and_their_neighbours() -> None:
    ops = timeline.context(_history(), ["p-0-3"])
    touching = [op["op"] for op in ops if op["touches"]]
    assert touching == [
        "send p-0-3",
        "ack p-0-3 at partition 0 offset 3",
        "poll 2 records (read committed): p-0-3 (partition 0 offset 3)",
    ]
    assert len(ops) == len(touching) + 2 * timeline.CONTEXT
    assert [op["at"] for op in ops] == sorted(op["at"] for op in ops)
    assert not any(op["op"] == "read" for op in ops)


def test_human_text_never_looks_like_json() -> None:
    assert human(None) == "-"
    assert human(True) == "yes"
    assert human(["lab", "x"]) == "lab, x"
    assert human({"acks_lost": 3}) == "acks lost 3"
    assert human([]) == "-"


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self._open = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("td", "th"):
            self._open = True
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        self._open = self._open and tag not in ("td", "th")

    def handle_data(self, data: str) -> None:
        if self._open:
            self.cells[-1] += data


JSON_LOOKING = re.compile(r'^(null|true|false|None|\[.*\]|\{.*\}|".*")$', re.S)


def _json_cells(page: str) -> list[str]:
    parser = _Cells()
    parser.feed(page)
    assert parser.cells
    return [cell for cell in parser.cells if JSON_LOOKING.match(cell.strip())]


def test_the_html_report_has_every_section_and_no_json_in_its_cells() -> None:
    rows = _matrix_rows()
    page = render_html([row["run"] for row in rows], matrix=rows, broker_table=_broker_rows())
    assert _json_cells(page) == []
    for section in (
        "At a glance",
        "Matrix",
        'class="grid"',
        "Broker table",
        "refused (NOT_ENOUGH_REPLICAS)",
        'id="broker-row-3"',
        "Coverage",
        'id="timeline-1"',
        'id="rates-1"',
        "Lost: 1 values (1 findings: lost-write 1)",
        "History around",
        "The mechanism at work",
        "30 transactions committed, 8 aborted on purpose, 1 fenced",
        "the log agrees with the history: yes (40 transactional records)",
    ):
        assert section in page, section
    assert "lost: 0 (never)" in page
    assert "duplicated: not tested</span> (may)" in page
    assert page.count('class="fault"') >= 2 * 3 * len(rows)  # three bands on both charts of each run
    # The negative control: the check finds a cell that holds JSON.
    assert _json_cells(page.replace(">300</td>", ">null</td>", 1)) == ["null"]


def test_the_matrix_is_a_grid_of_failures_against_guarantees() -> None:
    rows = _matrix_rows(6)
    page = render_html([row["run"] for row in rows], matrix=rows)
    grid = page.split('<table class="grid">', 1)[1].split("</table>", 1)[0]
    header = grid.split("</tr>", 1)[0]
    assert re.findall(r"<th>([^<]+)</th>", header) == list(promises.PREDICTIONS)
    body = grid.split("</tr>", 1)[1]
    assert body.count("<tr>") == len(matrix.FAILURES)  # a row per failure, not per cell
    # The idempotent producer has no consumer: its cells of D, E and F are not run.
    assert body.count('<td class="absent">not run</td>') == 3
    # Its "may" under a restart is explained under the grid.
    assert 'idempotent, "may": a restarted producer is a new session' in page
    for number in range(1, len(rows) + 1):
        assert f'<a href="#run-{number}">run #{number}</a>' in grid


def test_a_runs_counts_are_the_same_in_the_table_and_its_section() -> None:
    """One value stored twice in the input and so twice in the output: two findings, one value."""
    twice = {"kind": "duplicate", "values": ["p-0-4"], "detail": "stored 2 times", "history": []}
    anomalies = [{**twice, "offsets": []}, {**twice, "offsets": [], "detail": "stored 2 times in output"}]
    run = _run("at-least-once", lost=0, duplicated=1, anomalies=anomalies)
    run["verdicts"] = {"lost": "clean", "duplicated": "found"}
    page = render_html([run])
    table = page.split('<h2 id="runs">Runs</h2>', 1)[1].split("</table>", 1)[0]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", table.split("</tr>", 2)[1])
    assert cells[1:8] == ["values", "300", "297", "296", "0", "1", "no promise"], cells
    assert "Duplicated: 1 values (2 findings: duplicate 2)" in page


def _lines(render: Any) -> list[str]:
    console = Console(width=80, record=True, color_system=None)
    render(console)
    return console.export_text().splitlines()


def test_the_run_table_fits_80_columns_with_words_intact() -> None:
    runs = [_run(guarantee) for guarantee in promises.PREDICTIONS]
    runs.append(_run("exactly-once", stage="spark pipeline", balances_match=True, coverage=None))
    lines = _lines(lambda console: print_table(runs, console))
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    header = r"^#\s+guarantee\s+faults\s+sent\s+acked\s+deliv\s+lost\s+dup\s+aborted$"
    assert any(re.match(header, line.strip()) for line in lines), text
    for word in ("at-least-once", "exactly-once", "producer-crash", "zombie-consumer", "n/t"):
        assert word in text, word
    assert "n/t: not tested" in text
    assert "balances: exact" in text


def test_the_matrix_table_fits_80_columns_with_words_intact() -> None:
    lines = _lines(lambda console: matrix.print_matrix(_matrix_rows(), console))
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    header = r"^failure\s+guarantee\s+lost\s+dup\s+aborted\s+agrees$"
    assert any(re.match(header, line.strip()) for line in lines), text
    for word in ("at-least-once", "at-most-once", "0 never", "n/t may"):
        assert word in text, word


def _full_page(tmp_path: Path) -> Path:
    """The report of a whole matrix (21 runs, 1,798 px of bars in the old chart), a pipeline run (the
    balances check) and the broker table."""
    rows = _matrix_rows(6)
    pipeline = _run("at-least-once", stage="spark pipeline", unit="payments", balances_match=True)
    pipeline |= {"faults": ["spark-driver-kill"], "coverage": None, "verdicts": {}, "cross_check": None}
    page = tmp_path / "report.html"
    write_html([pipeline, *(row["run"] for row in rows)], page, matrix=rows, broker_table=_broker_rows())
    return page


BROKEN = {
    "clipped": '<svg width="100" height="40" viewBox="0 0 100 40"><text x="90" y="20">outside</text></svg>',
    "json": "<table><tr><td>null</td></tr></table>",
    "wide": '<table id="too-wide"><tr><td><div style="width: 3000px">x</div></td></tr></table>',
}
# A run's section whose heading lost its label (the page's first run).
UNLABELLED = ("<h2>#1 ", "<h2>")


@needs_chromium
@pytest.mark.chromium
@pytest.mark.parametrize(
    ("width", "breakage", "title"),
    [
        (1400, None, "report ok"),
        (900, None, "report ok"),
        # Negative controls: a label outside its drawing, a cell holding JSON, a table wider than
        # the window, a run's section without its label.
        (1400, "clipped", "report broken: clipped label: outside"),
        (1400, "json", "report broken: raw JSON in a cell: null"),
        (1400, "wide", "report broken: wider than the page: too-wide; the page scrolls sideways"),
        (1400, "unlabelled", "report broken: a run without a label: #1"),
    ],
)
def test_the_rendered_report_fits_the_window_with_labels_and_text_cells(
    tmp_path: Path, width: int, breakage: str | None, title: str
) -> None:
    page = _full_page(tmp_path)
    text = page.read_text()
    if breakage == "unlabelled":
        page.write_text(text.replace(*UNLABELLED, 1))
    elif breakage is not None:
        page.write_text(text.replace('<h2 id="runs">', BROKEN[breakage] + '<h2 id="runs">', 1))
    assert rendered_title(tmp_path, page, width) == title
    if breakage is None:
        shot = tmp_path / f"report-{width}.png"
        chromium(tmp_path, page, f"--screenshot={shot}", width=width, height=3000)
        assert shot.stat().st_size > 10_000, "the screenshot is blank"
