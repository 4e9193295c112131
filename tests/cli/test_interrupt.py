"""A SIGTERM or Ctrl-C to `onceflow lab` (as to the demo and the fuzzer) stops every process it
started: its broker and clients, which a SIGTERM to the command alone did not reach before.
(The demo's Spark pipelines, in sessions of their own, are stopped the same way: as processes
below the command.)"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.process_tree import alive, descendants
from tests.cli.processes import ctrl_c_as_from_a_terminal, kill_each, processes_naming
from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_lab_run_leaves_no_process_behind(tmp_path: Path, signum: int) -> None:
    lab = subprocess.Popen(
        [
            *(sys.executable, "-m", "onceflow.cli", "lab", "run", "--guarantee", "exactly-once"),
            *("--faults", "broker-crash", "--seconds", "60", "--workdir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the signal goes to the command alone, not to this test
        preexec_fn=ctrl_c_as_from_a_terminal,
    )
    started: set[int] = set()
    try:
        # Its broker and its clients: the broker first, the clients once it is up.
        wait_until(lambda: len(descendants(lab.pid)) >= 3, timeout_s=60)
        started = descendants(lab.pid)
        assert processes_naming(str(tmp_path)) & started, "the check below would find nothing"
        lab.send_signal(signum)
        _, errors = lab.communicate(timeout=30)
        assert lab.returncode == 128 + signum
        assert errors.strip().splitlines()[-1].startswith("onceflow: interrupted")
        wait_until(lambda: not any(alive(pid) for pid in started), timeout_s=15)
        # Also none started meanwhile (the lab restarts what dies): each process
        # it starts names its run's directory, under tmp_path, wherever it was adopted.
        wait_until(lambda: not processes_naming(str(tmp_path)), timeout_s=15)
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
        # Left behind: the test failed, and must not leak them too.
        kill_each({pid for pid in started if alive(pid)} | processes_naming(str(tmp_path)))
