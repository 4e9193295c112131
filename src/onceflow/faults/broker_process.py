"""`onceflow broker` as a subprocess, so that the lab and the fuzzer can SIGKILL it and start it again."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path


class BrokerProcess:
    """`onceflow broker` as a subprocess, so that the lab can SIGKILL it and start it on the same port."""

    def __init__(
        self, data_dir: Path, settings: dict[str, str], log_path: Path, metrics: bool = False
    ) -> None:
        self.data_dir = data_dir
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
        command = [sys.executable, "-m", "onceflow.cli", "broker", "--listen", f"127.0.0.1:{self.port}"]
        command += ["--data-dir", str(self.data_dir)]
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
