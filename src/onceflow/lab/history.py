"""The history of a lab run: one JSON object per line, one file per process.

Every process appends to its own file and writes each line through to the kernel at once, so a
SIGKILL loses at most the line being written; the reader skips such a torn last line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

Event = dict[str, Any]


class HistoryWriter:
    """Appends events of one process, e.g. `writer.record("ack", value="p0-1", partition=2, offset=7)`."""

    def __init__(self, path: Path, process: str) -> None:
        self.process = process
        self._file: TextIO = path.open("a", encoding="utf-8", buffering=1)

    def record(self, type_: str, **fields: Any) -> None:
        event = {"time": round(time.time(), 6), "process": self.process, "type": type_, **fields}
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()


def read_history(directory: Path) -> list[Event]:
    """Every event of every `*.jsonl` file in `directory`, each file in the order it was written."""
    events: list[Event] = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the torn line of a killed process
    return events
