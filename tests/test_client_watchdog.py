"""A worker stuck in a client call past its timeout exits, so its supervisor starts it again."""

from __future__ import annotations

import subprocess
import sys

from onceflow.client_watchdog import STUCK_EXIT_CODE

PROGRAM = """
import time
from onceflow import client_watchdog
client_watchdog.MARGIN_S = 0.2
with client_watchdog.exit_if_stuck(0.1, "the call"):
    time.sleep({call_s})
print("returned")
"""


def run(call_s: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", PROGRAM.format(call_s=call_s)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_call_stuck_past_its_timeout_ends_the_process_with_one_line() -> None:
    stuck = run(call_s=120)
    assert stuck.returncode == STUCK_EXIT_CODE
    assert stuck.stdout == ""
    assert stuck.stderr == "the call has not returned 0.3 s after it began: exiting\n"


def test_a_call_that_returns_in_time_goes_on() -> None:
    returned = run(call_s=0.01)
    assert (returned.returncode, returned.stdout, returned.stderr) == (0, "returned\n", "")
