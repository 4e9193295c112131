"""Stopping every process a command started when the command is interrupted.

The demo, the lab and the fuzzer start brokers, clients, ZooKeeper and Spark pipelines, some in
sessions of their own (a pipeline, so that one SIGKILL reaches its driver, JVM and workers).
A SIGTERM to the command reaches none of them and a Ctrl-C not those sessions: left behind, a
pipeline retries its vanished broker forever, with a JVM of a gigabyte.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import FrameType

from onceflow.sessions import stat_fields

GRACE_S = 5.0  # for brokers to close their logs before the SIGKILL
SWEEP_INTERVAL_S = 0.05
QUIET_SWEEPS = 4  # sweeps in a row that find nothing alive before the command exits
MAX_SWEEP_S = 10.0
SAY_TIMEOUT_S = 2.0
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


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
    after `GRACE_S`), says so in one line and exits with 128 + the signal.

    A thread of its own does it. The kernel hands a signal to any thread, and Python runs its
    handlers in the main thread only, once that thread runs bytecode again: a main thread
    blocked on a lock (waiting for a lab run's result) would never get there. The signal's
    number reaches the thread through Python's wakeup fd, which Python's C handler writes
    whichever thread took the signal; the Python handler only parks the main thread.

    This process also becomes a subreaper: a process whose parent dies (a pipeline's JVM once
    its driver is gone) is adopted here, not by init, so it stays below this one to be found."""
    if signal.getsignal(signal.SIGTERM) is _park_the_main_thread:
        return  # installed already (`main` run twice in one process)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT):
        # A script's background job starts with SIGINT ignored, and a Ctrl-C meant for the
        # script's foreground must not stop it: Python's own handler is not installed then either.
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _park_the_main_thread)
    watcher = threading.Thread(target=_stop_tree_when_signalled, args=(read_end,), daemon=True)
    watcher.start()


def _park_the_main_thread(_signum: int, _frame: FrameType | None) -> None:
    """The main thread waits here for the exit. Were it to go on, it would see its processes
    die, fail and exit (1, with a traceback) before the stopping ends; and a second Ctrl-C
    must not cut the stopping short."""
    threading.Event().wait()


def _stop_tree_when_signalled(read_end: int) -> None:
    while (signum := os.read(read_end, 1)[0]) not in (signal.SIGTERM, signal.SIGINT):
        pass  # another signal with a Python handler
    try:
        _hold_new_processes()
        stopped = _stop_descendants()
        name = signal.Signals(signum).name
        # A full pipe or a paused terminal must not keep the command from exiting.
        threading.Timer(SAY_TIMEOUT_S, os._exit, (128 + signum,)).start()
        _say(f"onceflow: interrupted by {name}; stopped {stopped} processes it started\n")
    finally:
        # Not SystemExit: the other threads would go on waiting on what was just stopped.
        os._exit(128 + signum)


def _say(line: str) -> None:
    """Straight to fd 2: `sys.stderr` may be locked by the parked main thread or replaced by a
    progress display (rich's, whose hidden cursor is shown again first)."""
    with contextlib.suppress(OSError):
        if os.isatty(1):
            os.write(1, b"\x1b[?25h")
        os.write(2, line.encode())


def _hold_new_processes() -> None:
    """From now on a thread that starts a process waits forever instead (until the exit): the
    command's threads go on while its processes are stopped, and one that restarts a process
    when it dies (the lab's broker and clients) would otherwise start another after each kill,
    perhaps one after the last sweep. Every process here starts through `subprocess.Popen`."""
    setattr(subprocess.Popen, "_execute_child", _wait_forever)  # noqa: B010 (a private method)


def _wait_forever(*_args: object, **_kwargs: object) -> None:
    threading.Event().wait()


def _stop_descendants() -> int:
    """SIGTERM every descendant, SIGKILL what is left after the grace, then sweep until none is
    alive (a process may have been starting as the hold came). Returns how many were stopped."""
    me = os.getpid()
    # Only descendants are signalled, each time found anew: a pid that died and was reused
    # belongs to someone else. The subreaper keeps the orphans among them.
    tree = _alive(descendants(me))
    _signal_each(tree, signal.SIGTERM)
    _signal_each(tree, signal.SIGCONT)  # a paused process (the lab's zombies) acts on it only then
    deadline = time.monotonic() + GRACE_S
    while _alive(descendants(me)) and time.monotonic() < deadline:
        time.sleep(SWEEP_INTERVAL_S)
    stopped = set(tree)
    quiet = 0
    give_up = time.monotonic() + MAX_SWEEP_S
    while quiet < QUIET_SWEEPS and time.monotonic() < give_up:
        left = _alive(descendants(me))
        _signal_each(left, signal.SIGKILL)
        stopped |= left
        quiet = 0 if left else quiet + 1
        time.sleep(SWEEP_INTERVAL_S)
    return len(stopped)


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if alive(pid)}


def _signal_each(pids: set[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):  # gone, or (a reused pid) not ours
            os.kill(pid, signum)


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie is dead, only not reaped)."""
    fields = stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is not None and fields[0] != "Z"
