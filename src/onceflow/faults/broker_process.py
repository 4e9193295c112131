"""`onceflow broker` as a subprocess, so that the lab and the fuzzer can SIGKILL it and start it again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from onceflow.cluster.ports import start_on_a_restartable_port
from onceflow.sessions import stat_fields


class BrokerProcess:
    """`onceflow broker` as a subprocess, so that the lab can SIGKILL it and start it on the same port."""

    def __init__(
        self,
        data_dir: Path,
        settings: dict[str, str],
        log_path: Path,
        metrics: bool = False,
        extra_args: Sequence[str] = (),
        listener: str = "PLAINTEXT",
    ) -> None:
        """`extra_args`: more `onceflow broker` arguments, e.g. `--zookeeper` and `--broker-id`;
        `listener`: the security protocol of its one listener (its `listeners` setting)."""
        self.data_dir = data_dir
        self.extra_args = list(extra_args)
        self.listener = listener
        self.settings = settings
        self.log_path = log_path
        self.metrics = metrics
        self.port = 0
        self.metrics_url: str | None = None  # with `metrics`: where this start of the broker serves them
        self.process: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        if self.port:  # a restart: the port its clients know
            return self._start_on(self.port)
        # Its first start: a port it can have again after a SIGKILL.
        return start_on_a_restartable_port(self._start_on)

    def _start_on(self, port: int) -> BrokerProcess:
        self.port = port
        command = [sys.executable, "-m", "onceflow.cli", "broker"]
        if self.listener == "PLAINTEXT":
            command += ["--listen", f"127.0.0.1:{self.port}"]
        else:
            command += ["--set", f"listeners={self.listener}://127.0.0.1:{self.port}"]
        command += ["--data-dir", str(self.data_dir), *self.extra_args]
        if self.metrics:
            command += ["--metrics", "127.0.0.1:0"]
        for key, value in self.settings.items():
            command += ["--set", f"{key}={value}"]
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.kill()
            raise RuntimeError(f"the broker did not start: {line!r}, see {self.log_path}")
        self.port = int(line.rsplit(":", 1)[1])
        if self.metrics:
            self.metrics_url = self.process.stdout.readline().rsplit(" ", 1)[1].strip()
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)


@contextmanager
def paused(processes: Sequence[subprocess.Popen[str]]) -> Iterator[None]:
    """SIGSTOP, SIGCONT on leaving: a stopped broker fetches and answers nothing, but its ZooKeeper
    session (and so its place in the ISR) lives on until the session timeout. Enters once every
    process is stopped (all its threads), not only signalled."""
    for process in processes:
        process.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: all(_stopped(process.pid) for process in processes), 10.0, 0.005)
        yield
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)


def _stopped(pid: int) -> bool:
    """Whether every thread of the process is stopped by a signal ("T" in its stat) or gone."""
    # No threads listed: the process is gone; a thread that ended meanwhile has no fields.
    threads = [stat_fields(task / "stat") for task in Path(f"/proc/{pid}/task").glob("*")]
    return all(fields[0] in "TZX" for fields in threads if fields is not None)


def wait_until(
    condition: Callable[[], object],
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
    what: str = "a condition",
) -> None:
    """Until `condition()` is true; past the deadline a TimeoutError that names `what` it waited for."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:g} s for {what}")
        time.sleep(interval_s)
