"""Named crash points for crash tests (after FreeBSD's fail points and etcd's gofail).

`ONCEFLOW_FAILPOINTS=txn.after-prepare,txn.between-markers` makes the process SIGKILL
itself the first time it reaches one of those points, so a test can stop the broker at an
exact step of a protocol and check what a restart makes of it. Unset, a point costs a set
lookup. Three points plant bugs, so that the fuzzer's detectors can be shown to fire:
`protocol.no-bounds-check` hands frames to kio's native reader unchecked, `api.raise.K` makes
the handler of API key K raise, and `api.block.K` makes it hold the event loop for 2 s, four
times. One injects an error: `flush.eio-once` makes the process's first partition flush fail with EIO, as
a disk would.

A point reached through `hold` instead stops there until the process is killed from outside: the
first process to reach it (of all that have it armed) writes its pid to the file named after the
point in `ONCEFLOW_FAILPOINT_DIR` and sleeps, so a test can wait for that file and kill the process,
or the machine around it, at that exact step. Later arrivals, such as the retry of a killed task,
go on. A test may also let the holder go on (`release`), after pausing the whole process, say.

`markers.unfenced` makes partitions take transaction markers from a deposed coordinator (the
negative control of the coordinator epoch check).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from onceflow.sessions import kill_session

_ARMED = frozenset(filter(None, os.environ.get("ONCEFLOW_FAILPOINTS", "").split(",")))
_reached: set[str] = set()


def armed(name: str) -> bool:
    return name in _ARMED


def armed_with_prefix(prefix: str) -> list[str]:
    """The rest of each armed name that starts with `prefix`: `api.raise.` gives ["32"] for api.raise.32."""
    return [name[len(prefix) :] for name in _ARMED if name.startswith(prefix)]


def first_time(name: str) -> bool:
    """Whether `name` is armed and reached for the first time in this process."""
    if name not in _ARMED or name in _reached:
        return False
    _reached.add(name)
    return True


def reach(name: str, whole_session: bool = False) -> None:
    """SIGKILL this process, or every process of its session (a Spark driver, JVM and workers)."""
    if name not in _ARMED:
        return
    if whole_session:
        kill_session(os.getsid(0))
    os.kill(os.getpid(), signal.SIGKILL)


def hold(name: str) -> None:
    """Sleep for good if this is the first process to reach `name`; see the module's docstring."""
    if name not in _ARMED:
        return
    try:
        # Created exclusively: one process holds, whatever number of them race here.
        with (Path(os.environ["ONCEFLOW_FAILPOINT_DIR"]) / name).open("x") as claimed:
            claimed.write(str(os.getpid()))
    except FileExistsError:
        return
    released = _released(name)
    while not released.exists():
        time.sleep(0.05)


def release(directory: Path, name: str) -> None:
    """Let the process that holds at `name` (with `directory` its ONCEFLOW_FAILPOINT_DIR) go on."""
    (directory / f"{name}.released").touch()


def _released(name: str) -> Path:
    return Path(os.environ["ONCEFLOW_FAILPOINT_DIR"]) / f"{name}.released"
