"""The report's drawings as inline SVG: a run's timeline (its clients' lives and the faults as
bands), its sends and acks per second with the ack latency, the runs' anomalies as labelled bars,
and a broker-table row's writes, each with what became of it and the fault it was sent under.

Each drawing takes plain data and returns one `<svg>` element with a `viewBox`, at most about
900 px wide at its natural size; the page lets it shrink to a narrower window (`max-width: 100%`).
Every label lies inside its drawing (the page checks that once rendered, see `report.SELF_CHECK`).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

FONT_PX = 11
CHAR_PX = 7.0  # an upper bound of a character's width at FONT_PX in a sans-serif face
PLOT_W = 720
# A bar of the summary chart: its name, its value (None: not tested, or no promise) and colour.
Bar = tuple[str, int | None, str, str]  # name, value, colour, text when value is None
FATE_COLOURS = {"kept": "#2ca02c", "lost": "#d62728", "refused": "#ff7f0e", "unanswered": "#999999"}
FATE_TEXT = {
    "kept": "acknowledged, read back",
    "lost": "acknowledged, lost",
    "refused": "refused (NOT_ENOUGH_REPLICAS)",
    "unanswered": "never answered",
}


def svg_open(name: str, width: float, height: float) -> str:
    return (
        f'<svg id="{name}" xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}" role="img">'
    )


def summary_chart(runs: Sequence[tuple[str, Sequence[Bar]]]) -> str:
    """A group per run, its label on top (`text.run-label`) and a labelled bar per anomaly, all
    on one scale: horizontal, so that any number of runs fits the width of the page."""
    label_h, bar_h, bar_gap, group_gap, left, right = 18, 12, 3, 12, 96, 110
    bars_per_run = max([1, *(len(bars) for _label, bars in runs)])
    group_h = label_h + bars_per_run * (bar_h + bar_gap) + group_gap
    longest = max([0, *(len(label) for label, _bars in runs)])
    width = max(left + PLOT_W + right, 16 + CHAR_PX * longest)
    height = 8 + max(1, len(runs)) * group_h
    peak = max([1, *(value or 0 for _label, bars in runs for _name, value, _colour, _text in bars)])
    parts = [svg_open("chart", width, height)]
    for index, (label, bars) in enumerate(runs):
        y0 = 8 + index * group_h
        parts.append(f'<g class="run" data-run="{index + 1}">')
        parts.append(f'<text class="run-label" x="8" y="{y0 + 13}">{html.escape(label)}</text>')
        for row, (name, value, colour, text) in enumerate(bars):
            y = y0 + label_h + row * (bar_h + bar_gap)
            w = 0.0 if value is None else max(1.0, PLOT_W * value / peak)  # a zero shows as a hairline
            shown = text if value is None else str(value)
            parts.append(
                f'<text x="{left - 6}" y="{y + 10}" text-anchor="end">{html.escape(name)}</text>'
                f'<rect class="bar" x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colour}">'
                f"<title>{html.escape(label)}: {html.escape(name)} {html.escape(shown)}</title></rect>"
                f'<text x="{left + w + 6:.1f}" y="{y + 10}">{html.escape(shown)}</text>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


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


def _fault_bands(
    bands: Sequence[Mapping[str, Any]], duration: float, left: float, top: float, height: float
) -> list[str]:
    parts = []
    for band in bands:
        x = left + PLOT_W * band["start"] / duration
        w = max(2.0, PLOT_W * (band["end"] - band["start"]) / duration)
        parts.append(
            f'<rect class="fault" x="{x:.1f}" y="{top}" width="{w:.1f}" height="{height}" '
            f'fill="#d62728" fill-opacity="0.12"><title>{html.escape(band["label"])}: '
            f"{band['start']:g} s to {band['end']:g} s</title></rect>"
        )
    return parts


def _band_lines(bands: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"{band['label']}: {band['start']:g} s to {band['end']:g} s" for band in bands]


def timeline_chart(number: int, timeline: Mapping[str, Any]) -> str:
    """The clients' lives as lanes (a cross where one died and was started again), the faults as
    bands across them and listed under the axis."""
    lanes, bands = timeline["lanes"], timeline["bands"]
    lane_h, top = 22, 10
    names = [lane["name"] for lane in lanes]
    left = 16 + CHAR_PX * max([len(name) for name in names] + [6])
    plot_h = lane_h * max(1, len(lanes))
    band_lines = _band_lines(bands)
    width = max(left + PLOT_W + 30, 16 + CHAR_PX * max([len(line) for line in band_lines] + [0]))
    height = top + plot_h + 30 + 16 * len(band_lines) + 8
    duration = timeline["duration"]
    parts = [svg_open(f"timeline-{number}", width, height)]
    parts += _fault_bands(bands, duration, left, top, plot_h)
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
                    f'<path class="kill" d="M{x2 - 4:.1f} {y + 3} l8 16 m0 -16 l-8 16" stroke="#d62728" '
                    'stroke-width="2"/>'
                )
    parts += _x_axis(duration, left, top + plot_h)
    for index, line in enumerate(band_lines):
        parts.append(f'<text x="16" y="{top + plot_h + 40 + 16 * index}">{html.escape(line)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def rate_chart(number: int, timeline: Mapping[str, Any]) -> str:
    """Sends and acks per second, and the ack latency (median and worst), over the same time axis."""
    buckets, bucket_s, duration = timeline["buckets"], timeline["bucket_s"], timeline["duration"]
    bands = timeline["bands"]
    left, plot_h, gap, top = 70, 110, 50, 24
    width, height = left + PLOT_W + 110, top + 2 * plot_h + gap + 30
    rates = [(b["sends"] / bucket_s, b["acks"] / bucket_s) for b in buckets]
    peak_rate = max([1.0, *(max(pair) for pair in rates)])
    latencies = [b["latency_max_ms"] for b in buckets if b["latency_max_ms"] is not None]
    peak_ms = max([1.0, *latencies])
    parts = [svg_open(f"rates-{number}", width, height)]
    for y0, heading in ((top, "messages per second"), (top + plot_h + gap, "ack latency (ms)")):
        parts += _fault_bands(bands, duration, left, y0, plot_h)
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


def broker_row_chart(index: int, picture: Mapping[str, Any]) -> str:
    """A broker-table row: its values in the order written, each a box coloured by what became of
    it, shaded and named by the fault under way when it was sent; under them a legend, and the
    fault's steps and the read-back in seconds (the writes take a fraction of a second, the
    failover many: on one time axis they would crowd into a corner)."""
    marks, bands = picture["marks"], picture["bands"]
    box_w = min(84.0, PLOT_W / max(1, len(marks)))
    box_h, left, top = 22, 16, 26
    lines = _band_lines(bands) + [f"read back at {read:g} s" for read in picture["reads"]]
    legend_y = top + box_h + 28
    width = left + max(box_w * len(marks), 620.0, CHAR_PX * max([len(line) for line in lines] + [0])) + 16
    height = legend_y + 12 + 16 * len(lines) + 6
    parts = [svg_open(f"broker-row-{index}", width, height)]
    # Consecutive values sent under the same faults share one shaded stretch, named above it.
    stretches: list[tuple[int, int, str]] = []
    for position, mark in enumerate(marks):
        under = ", ".join(band["label"] for band in bands if band["start"] <= mark["at"] < band["end"])
        if stretches and stretches[-1][2] == under and stretches[-1][1] == position:
            stretches[-1] = (stretches[-1][0], position + 1, under)
        else:
            stretches.append((position, position + 1, under))
    for first, end, under in stretches:
        if under:
            x = left + first * box_w
            parts.append(
                f'<rect class="fault" x="{x:.1f}" y="{top - 4}" width="{(end - first) * box_w:.1f}" '
                f'height="{box_h + 8}" fill="#d62728" fill-opacity="0.12"/>'
                f'<text x="{x + 2:.1f}" y="{top - 8}">{html.escape(under)}</text>'
            )
    for position, mark in enumerate(marks):
        x = left + position * box_w
        parts.append(
            f'<rect class="write" x="{x + 2:.1f}" y="{top}" width="{box_w - 4:.1f}" height="{box_h}" '
            f'fill="{FATE_COLOURS[mark["fate"]]}"><title>{html.escape(mark["value"])}, sent at '
            f"{mark['at']:g} s: {FATE_TEXT[mark['fate']]}</title></rect>"
            f'<text x="{x + box_w / 2:.1f}" y="{top + 15}" text-anchor="middle" style="fill: #fff">'
            f"{html.escape(mark['value'])}</text>"
        )
    x = float(left)
    for fate, colour in FATE_COLOURS.items():
        text = FATE_TEXT[fate]
        parts.append(
            f'<rect x="{x:.0f}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14:.0f}" y="{legend_y}">{html.escape(text)}</text>'
        )
        x += 14 + CHAR_PX * len(text) + 14
    for number, line in enumerate(lines):
        parts.append(f'<text x="{left}" y="{legend_y + 18 + 16 * number}">{html.escape(line)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
