"""Stopping every process a command started when the command is interrupted.

The demo, the lab and the fuzzer start brokers, clients, ZooKeeper and Spark pipelines, some in
sessions of their own (a pipeline, so that one SIGKILL reaches its driver, JVM and workers).
A SIGTERM to the command reaches none of them and a Ctrl-C not those sessions: left behind, a
pipeline retries its vanished broker forever, with a JVM of a gigabyte.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from onceflow.sessions import stat_fields

GRACE_S = 5.0  # for brokers to close their logs before the SIGKILL


def descendants(pid: int) -> set[int]:
    """The processes below `pid`, by their parents in /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_fields(entry / "stat")) is not None:
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def stop_tree_on_interrupt() -> None:
    """From now on a SIGTERM or SIGINT stops this process's descendants (SIGTERM, then SIGKILL
    after `GRACE_S`), says so in one line and exits with 128 + the signal."""
    signal.signal(signal.SIGTERM, _stop_tree)
    signal.signal(signal.SIGINT, _stop_tree)


def _stop_tree(signum: int, _frame: FrameType | None) -> None:
    for ignored in (signal.SIGTERM, signal.SIGINT):  # a second Ctrl-C must not cut this short
        signal.signal(ignored, signal.SIG_IGN)
    # All of them first: a process whose parent dies is no longer found below this one.
    tree = descendants(os.getpid())
    _signal_each(tree, signal.SIGTERM)
    _signal_each(tree, signal.SIGCONT)  # a paused process (the lab's zombies) acts on it only then
    deadline = time.monotonic() + GRACE_S
    while (left := [pid for pid in tree if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_each(set(left) | descendants(os.getpid()), signal.SIGKILL)
    name = signal.Signals(signum).name
    try:
        print(f"onceflow: interrupted by {name}; stopped {len(tree)} processes it started", file=sys.stderr)
        sys.stderr.flush()
    finally:
        # Not SystemExit: threads would go on waiting on what was just stopped.
        os._exit(128 + signum)


def _signal_each(pids: set[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie is dead, only not reaped)."""
    fields = stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is not None and fields[0] != "Z"
