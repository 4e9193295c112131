"""How long a thread waited for a CPU: the kernel's run delay, and the time the hypervisor took
the machine's CPUs away (steal), from /proc.

A probe that a broker answers late on a loaded machine waited for a core (the broker's event
loop, or the prober's, was ready to run and had none); a broker that holds its event loop (a
blocking call, a long computation) keeps it from answering while it sleeps or runs. The
difference tells a held loop from a busy machine without asking the broker anything."""

from __future__ import annotations

import os
from pathlib import Path

SELF = Path("/proc/thread-self/schedstat")
_STEAL_FIELD = 8  # of /proc/stat's first line, in clock ticks summed over the CPUs


def waited_s(schedstat: Path) -> float | None:
    """The seconds the thread of `schedstat` (/proc/PID/schedstat: a process's main thread) has
    waited for a CPU since it started; None once it is gone or where the kernel keeps no count."""
    try:
        return int(schedstat.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def stolen_s() -> float:
    """The seconds the hypervisor has kept an average CPU of this machine from running since boot."""
    try:
        ticks = int(Path("/proc/stat").read_text().split(maxsplit=_STEAL_FIELD + 1)[_STEAL_FIELD])
    except (OSError, IndexError, ValueError):
        return 0.0
    return ticks / os.sysconf("SC_CLK_TCK") / (os.cpu_count() or 1)
