"""The lab's reports from a made-up history: the timeline, the operations around an anomaly, tables
that fit 80 columns, and an HTML page whose cells hold text and whose labels fit, checked by the page
itself in headless Chromium (with broken pages as negative controls)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from onceflow.lab import matrix, timeline
from onceflow.lab.history import Event
from onceflow.lab.report import human, print_table, render_html, write_html
from tests.lab.chromium import needs_chromium, rendered_title

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
        "coverage": {"aborted_records_in_log": 12, "acks_lost": 3, "zombies_resumed": 0},
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


def _matrix_rows() -> list[dict[str, Any]]:
    rows = []
    for failure in matrix.FAILURES[:2]:
        for guarantee in matrix.PREDICTIONS:
            cells = {
                name: {"predicted": predicted, "measured": None if name == "duplicated" else 0,
                       "verdict": "clean", "agrees": None if name == "duplicated" else True}
                for name, predicted in matrix.PREDICTIONS[guarantee].items()
            }  # fmt: skip
            run = _run(guarantee, faults=list(failure.faults))
            row = {"failure": failure.key, "title": failure.title, "guarantee": guarantee}
            rows.append({**row, "faults": list(failure.faults), "cells": cells, "agrees": True, "run": run})
    return rows


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
    page = render_html([row["run"] for row in rows], matrix=rows)
    assert _json_cells(page) == []
    for section in (
        "Matrix",
        "Coverage",
        'id="timeline-1"',
        'id="rates-1"',
        "lost-write: 1",
        "History around",
    ):
        assert section in page
    assert "measured 0, predicted never: agrees" in page
    assert "measured not tested, predicted" in page
    assert page.count('class="fault"') >= 2 * 3 * len(rows)  # three bands on both charts of each run
    # The negative control: the check finds a cell that holds JSON.
    assert _json_cells(page.replace("<td>7</td>", "<td>null</td>", 1)) == ["null"]


def _lines(render: Any) -> list[str]:
    console = Console(width=80, record=True, color_system=None)
    render(console)
    return console.export_text().splitlines()


def test_the_run_table_fits_80_columns_with_words_intact() -> None:
    runs = [_run(guarantee) for guarantee in matrix.PREDICTIONS]
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


@needs_chromium
@pytest.mark.chromium
@pytest.mark.parametrize(
    ("breakage", "title"),
    [
        (None, "report ok"),
        # Negative controls: a label outside its drawing, a cell holding JSON.
        (
            '<svg width="100" height="40" viewBox="0 0 100 40"><text x="90" y="20">outside</text></svg>',
            "report broken: clipped label: outside",
        ),
        ("<table><tr><td>null</td></tr></table>", "report broken: raw JSON in a cell: null"),
    ],
)
def test_the_rendered_report_checks_its_labels_and_cells(
    tmp_path: Path, breakage: str | None, title: str
) -> None:
    rows = _matrix_rows()
    page = tmp_path / "report.html"
    write_html([row["run"] for row in rows], page, matrix=rows)
    if breakage is not None:
        page.write_text(page.read_text().replace("<h2>Runs</h2>", breakage + "<h2>Runs</h2>"))
    assert rendered_title(tmp_path, page) == title
