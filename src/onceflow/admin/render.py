"""What a command prints: rich tables for people, or the same facts as JSON for scripts."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table as RichTable

# Piped output has no terminal width; a wide one keeps table rows on one line for grep.
_PIPED_WIDTH = 200


def plain(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(item) for item in value) or "-"
    return str(value)


def duration(milliseconds: Any) -> str:
    """1h02m, 3m05s, 12.3s, 250ms."""
    if milliseconds is None or milliseconds < 0:
        return "-"
    if milliseconds < 1000:
        return f"{milliseconds}ms"
    seconds = milliseconds / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def timestamp(epoch_ms: Any) -> str:
    if epoch_ms is None or epoch_ms < 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000).astimezone()
    return moment.isoformat(sep=" ", timespec="seconds")


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    format: Callable[[Any], str] = plain
    justify: JustifyMethod = "left"


@dataclass(frozen=True)
class Table:
    columns: Sequence[Column]
    rows: Sequence[Mapping[str, Any]]
    title: str | None = None
    empty: str = "none"


@dataclass(frozen=True)
class Report:
    data: Any
    """What --json prints: plain values, the same facts the tables show."""
    tables: Sequence[Table] = ()
    notes: Sequence[str] = ()


def show(report: Report, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.data, indent=2))
        return
    # markup off: names like 'orders[eu]' must print as they are.
    console = Console(width=None if sys.stdout.isatty() else _PIPED_WIDTH, highlight=False, markup=False)
    for table in report.tables:
        if not table.rows:
            console.print(f"{table.title}: {table.empty}" if table.title else table.empty)
            continue
        rich_table = RichTable(
            title=table.title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
        )
        for column in table.columns:
            rich_table.add_column(column.header, justify=column.justify, no_wrap=True)
        for row in table.rows:
            rich_table.add_row(*(column.format(row.get(column.key)) for column in table.columns))
        console.print(rich_table)
    for note in report.notes:
        console.print(note)
