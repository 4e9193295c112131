"""Killing a whole session of processes: a Spark driver, its JVM, PySpark's daemon and workers.

A session, not a process group: PySpark's worker daemon moves to a process group of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def stat_fields(stat_path: Path) -> list[str] | None:
    """The fields of a /proc `stat` file after the command name (the state first, then the
    parent, the process group, the session), or None when the process or thread is gone."""
    try:
        stat = stat_path.read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces.
    return stat[stat.rindex(")") + 2 :].split()


def session_members(session_id: int) -> list[int]:
    """Live processes of a session (a zombie is dead, only not reaped)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(entry / "stat")
            if fields is not None and int(fields[3]) == session_id and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def kill_session(session_id: int, timeout_s: float = 30.0) -> None:
    """SIGKILL every process of the session, the caller too if it belongs to it."""
    deadline = time.monotonic() + timeout_s
    while members := [pid for pid in session_members(session_id) if pid != os.getpid()]:
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {members} outlive SIGKILL")
        time.sleep(0.05)
    if os.getsid(0) == session_id:
        os.kill(os.getpid(), signal.SIGKILL)
