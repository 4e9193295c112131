"""`stop_tree_on_interrupt` against the two things that made interrupted commands leave processes
behind: a main thread blocked on a lock (as the lab's, waiting for its runs' results), and a
thread that starts a process again whenever it dies (as the lab's supervisor)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.processes import ctrl_c_as_from_a_terminal, kill_each, processes_naming
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(60)

COMMAND = """
import subprocess, sys, threading
from onceflow.process_tree import stop_tree_on_interrupt

stop_tree_on_interrupt()
marker = sys.argv[1]

def restart_forever():
    while True:
        subprocess.run([sys.executable, "-c", "import time; time.sleep(60)", marker + "-child"])

threading.Thread(target=restart_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_tree_although_the_main_thread_waits_and_another_restarts(
    tmp_path: Path, signum: int
) -> None:
    marker = str(tmp_path)  # unique to this run, even beside other pytest sessions
    children = f"{marker}-child"  # not in the command's own command line
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND, marker],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the signal goes to the command alone
        preexec_fn=ctrl_c_as_from_a_terminal,
    )
    try:
        assert command.stdout is not None and command.stdout.readline().strip() == "ready"
        wait_until(lambda: bool(processes_naming(children)), timeout_s=30)
        command.send_signal(signum)
        _, errors = command.communicate(timeout=30)
        assert command.returncode == 128 + signum
        assert errors.strip().splitlines()[-1].startswith(f"onceflow: interrupted by {signum.name}")
        wait_until(lambda: not processes_naming(children), timeout_s=5)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        kill_each(processes_naming(children))  # left behind: the test failed, and must not leak them
