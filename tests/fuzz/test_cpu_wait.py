"""The kernel's count of a thread's wait for a CPU, which tells the fuzzer's held-loop detector a
busy machine from a broker that holds its event loop."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from onceflow.fuzz import cpu_wait
from tests.conftest import wait_until

SPIN = "while True: pass"


@contextmanager
def started(*commands: list[str]) -> Iterator[list[subprocess.Popen[bytes]]]:
    processes = [subprocess.Popen(command) for command in commands]
    try:
        yield processes
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)


def waited(process: subprocess.Popen[bytes]) -> float:
    seconds = cpu_wait.waited_s(Path(f"/proc/{process.pid}/schedstat"))
    assert seconds is not None
    return seconds


def test_a_thread_sharing_its_core_waits_and_a_sleeping_one_does_not() -> None:
    on_one_core = ["taskset", "-c", "0", sys.executable, "-c", SPIN]
    with started(on_one_core, on_one_core, ["sleep", "60"]) as (spinner, rival, sleeper):
        wait_until(lambda: waited(spinner) > 0.5, timeout_s=30, what="a spinner waiting for its core")
        assert waited(rival) > 0.1
        assert waited(sleeper) < waited(spinner) / 5  # its start-up's, on a loaded machine


def test_a_thread_that_is_gone_has_no_count() -> None:
    with started(["true"]) as (gone,):
        gone.wait(timeout=10)
    assert cpu_wait.waited_s(Path(f"/proc/{gone.pid}/schedstat")) is None
    assert cpu_wait.waited_s(cpu_wait.SELF) is not None
    assert cpu_wait.stolen_s() >= 0
