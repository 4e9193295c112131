"""Named crash points for crash tests (after FreeBSD's fail points and etcd's gofail).

`ONCEFLOW_FAILPOINTS=txn.after-prepare,txn.between-markers` makes the process SIGKILL
itself the first time it reaches one of those points, so a test can stop the broker at an
exact step of a protocol and check what a restart makes of it. Unset, a point costs a set
lookup.
"""

from __future__ import annotations

import os
import signal

_ARMED = frozenset(filter(None, os.environ.get("ONCEFLOW_FAILPOINTS", "").split(",")))


def armed(name: str) -> bool:
    return name in _ARMED


def reach(name: str) -> None:
    if name in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
