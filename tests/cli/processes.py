"""Finding the processes a command left behind, wherever they were adopted."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from onceflow.process_tree import alive


def processes_naming(text: str) -> set[int]:
    """Live processes with `text` in their command line."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command_line = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in command_line and alive(int(entry.name)):
                found.add(int(entry.name))
    return found


def kill_each(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def ctrl_c_as_from_a_terminal() -> None:
    """A `preexec_fn`: SIGINT's default action in the command, as a terminal's foreground job
    has it. A suite started in the background (`make test &`) ignores SIGINT, which its commands
    would inherit, and rightly ignore."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
