"""`onceflow lab run` end to end: each guarantee under lost acks and producer and consumer crashes,
on the lab's own broker, then the JSON and HTML reports (the HTML rendered by headless Chromium)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from onceflow.lab.checker import KINDS
from onceflow.lab.report import write_html
from tests.lab.chromium import chromium, needs_chromium, rendered_title

pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("lab")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "onceflow.cli",
            "lab",
            "run",
            "--guarantee",
            "at-most-once",
            "--guarantee",
            "at-least-once",
            "--guarantee",
            "exactly-once",
            "--faults",
            "lost-acks,producer-crash,consumer-crash",
            "--messages",
            "300",
            "--seed",
            "7",
            "--json",
            str(out / "lab.json"),
            "--html",
            str(out / "lab.html"),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "delivery-semantics lab" in completed.stdout
    return json.loads((out / "lab.json").read_text()), out / "lab.html"


def _run(report: dict[str, Any], guarantee: str) -> dict[str, Any]:
    [run] = [run for run in report["runs"] if run["guarantee"] == guarantee]
    assert run["drained"], f"the workers never caught up, so the counts mean nothing: {run['injected']}"
    assert run["produced"] >= 300 and run["acknowledged"] > 0
    return run


@pytest.mark.timeout(200)
def test_exactly_once_has_no_anomaly(lab_run: tuple[dict[str, Any], Path]) -> None:
    run = _run(lab_run[0], "exactly-once")
    assert run["anomalies"] == [], (run["injected"], run["anomalies"][:5])
    assert run["delivered"] >= run["acknowledged"]
    # Each 0 was tested: aborted transactions reached the log, acks were lost, workers were killed.
    assert run["verdicts"] == {"lost": "clean", "duplicated": "clean", "aborted_reads": "clean"}
    assert run["coverage"]["aborted_records"] > 0
    # A killed producer's transaction sent again by its successor, its earlier copies aborted.
    assert run["coverage"]["resent_by_new_session"] > 0
    assert run["cross_check"]["agrees"] and run["cross_check"]["compared"] > 0
    assert run["coverage"]["acks_lost"] > 0
    assert run["coverage"]["consumers_killed_before_commit"] > 0


def test_at_least_once_loses_nothing(lab_run: tuple[dict[str, Any], Path]) -> None:
    run = _run(lab_run[0], "at-least-once")
    assert run["lost"] == 0, run["anomalies"][:5]
    assert run["delivered"] >= run["acknowledged"]


def test_at_most_once_duplicates_nothing(lab_run: tuple[dict[str, Any], Path]) -> None:
    run = _run(lab_run[0], "at-most-once")
    assert run["duplicated"] == 0, run["anomalies"][:5]


def test_each_run_reads_its_brokers_metrics(lab_run: tuple[dict[str, Any], Path]) -> None:
    for run in lab_run[0]["runs"]:
        metrics = run["broker_metrics"]
        assert metrics["requests"]["Produce"] > 0 and metrics["requests"]["Fetch"] > 0, metrics
        assert metrics["bytes_in"] > 0 and metrics["bytes_out"] > 0 and metrics["flushes"] > 0
        # Only exactly-once ends transactions.
        assert (metrics["requests"].get("EndTxn", 0) > 0) == (run["guarantee"] == "exactly-once"), metrics


def test_the_faults_were_injected(lab_run: tuple[dict[str, Any], Path]) -> None:
    for run in lab_run[0]["runs"]:
        injected = " ".join(run["injected"])
        assert "lose-acks" in injected and "SIGKILL producer" in injected and "SIGKILL worker" in injected


def test_the_json_report_has_the_documented_shape(lab_run: tuple[dict[str, Any], Path]) -> None:
    report = lab_run[0]
    assert set(report) == {"runs"}
    assert [run["guarantee"] for run in report["runs"]] == ["at-most-once", "at-least-once", "exactly-once"]
    for run in report["runs"]:
        assert isinstance(run["guarantee"], str)
        assert run["faults"] == ["lost-acks", "producer-crash", "consumer-crash"]
        for key in ("produced", "acknowledged", "delivered", "lost", "duplicated", "aborted_reads"):
            assert isinstance(run[key], int) and run[key] >= 0, key
        assert isinstance(run["anomalies"], list)
        for anomaly in run["anomalies"]:
            assert anomaly["kind"] in KINDS
            assert anomaly["values"] and all(isinstance(value, str) for value in anomaly["values"])
            assert isinstance(anomaly["detail"], str)
            for offset in anomaly["offsets"]:
                assert set(offset) == {"topic", "partition", "offset"}
                assert isinstance(offset["partition"], int) and isinstance(offset["offset"], int)
        assert all(isinstance(count, int) and count >= 0 for count in run["coverage"].values())
        # What the report draws: the faults as they happened, the clients' lives, sends and acks.
        bands = {band["label"] for band in run["timeline"]["bands"]}
        assert "lost acks" in bands and any(label.endswith(" killed") for label in bands), bands
        assert {lane["name"] for lane in run["timeline"]["lanes"]} >= {"producer-0", "worker-0"}
        assert sum(bucket["acks"] for bucket in run["timeline"]["buckets"]) >= run["acknowledged"]
        for anomaly in run["anomalies"][:20]:
            assert any(op["touches"] for op in anomaly["history"]), anomaly
        assert set(run["verdicts"].values()) <= {"found", "clean"}, run["verdicts"]  # else exit 1
        kinds = [anomaly["kind"] for anomaly in run["anomalies"]]
        assert run["lost"] == kinds.count("lost-write") + kinds.count("lost-downstream")
        assert run["aborted_reads"] == kinds.count("aborted-read")


def _title(dom: str) -> str:
    return dom.split("<title>", 1)[1].split("</title>", 1)[0]


def _png_pixels(path: Path) -> bytes:
    """The decompressed scanlines of a PNG: enough to tell a blank page from a drawn one."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, idat = 8, b""
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        if kind == b"IDAT":
            idat += data[position + 8 : position + 8 + length]
        position += 12 + length
    return zlib.decompress(idat)


@needs_chromium
@pytest.mark.chromium
def test_the_html_report_renders_its_chart_inchromium(
    lab_run: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    page = lab_run[1]
    assert "<script src" not in page.read_text() and "http" not in page.read_text().replace(
        "http://www.w3.org/2000/svg", ""
    ), "the page must be self-contained"
    # The page checks itself: its summary chart has bars, no label is clipped, no cell holds JSON
    # (tests/lab/test_report.py shows the check failing on broken pages).
    dom = chromium(tmp_path, page, "--dump-dom")
    assert _title(dom.stdout) == "report ok", dom.stderr[-2000:]
    assert dom.stdout.count('class="bar"') == 9
    for number in (1, 2, 3):
        assert f'id="timeline-{number}"' in dom.stdout and f'id="rates-{number}"' in dom.stdout
    screenshot = tmp_path / "lab.png"
    chromium(tmp_path, page, f"--screenshot={screenshot}")
    assert screenshot.exists()
    assert len(set(_png_pixels(screenshot))) > 16, "the screenshot is blank"


@needs_chromium
@pytest.mark.chromium
def test_a_page_without_its_chart_is_caught(lab_run: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    page = tmp_path / "no-bars.html"
    write_html(lab_run[0]["runs"], page)
    page.write_text(page.read_text().replace('class="bar"', 'class="gone"'))
    assert rendered_title(tmp_path, page) == "report broken: chart missing"
    write_html([], page)  # a page of the broker table alone has no runs, and no chart to miss
    assert rendered_title(tmp_path, page) == "report ok"
