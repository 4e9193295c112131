"""The same pipeline command on a Spark standalone cluster: a master and two workers on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pyspark
import pytest

from onceflow.pipeline.events import generate
from onceflow.pipeline.process import PipelineProcess, read_balances, read_outputs, session_members
from onceflow.pipeline.settings import PipelineSettings
from tests.conftest import BrokerProcess
from tests.pipeline.conftest import SPARK_ENV, log_tail

SPARK_HOME = Path(pyspark.__file__).parent


class Daemon:
    """A Spark master or worker JVM (`bin/spark-class`), in a session of its own with its executors."""

    def __init__(self, name: str, args: list[str], log_dir: Path) -> None:
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **SPARK_ENV, "SPARK_HOME": str(SPARK_HOME)},
                start_new_session=True,
            )

    def wait_for(self, pattern: str, timeout_s: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while not (found := re.search(pattern, self.log.read_text(errors="replace"))):
            assert self.process.poll() is None, f"{self.log.name} exited:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} in {self.log.name}"
            time.sleep(0.2)
        return found

    def stop(self) -> None:
        for pid in session_members(self.process.pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(30)


@pytest.fixture
def standalone_master(tmp_path: Path) -> Iterator[str]:
    """The URL of a master with two one-core workers; all of it is killed afterwards."""
    daemons = [
        Daemon(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            tmp_path,
        )
    ]
    try:
        url = daemons[0].wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
        for number in range(2):
            work_dir = tmp_path / f"worker-{number}"
            work_dir.mkdir()
            worker_args = ["--host", "127.0.0.1", "--webui-port", "0", "--cores", "1", "--memory", "1g"]
            daemons.append(
                Daemon(
                    f"worker-{number}",
                    ["org.apache.spark.deploy.worker.Worker", *worker_args, "--work-dir", str(work_dir), url],
                    tmp_path,
                )
            )
        for worker in daemons[1:]:
            worker.wait_for("Successfully registered with master")
        yield url
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


@pytest.mark.timeout(170)
def test_pipeline_on_a_standalone_cluster(
    broker_process: BrokerProcess,
    standalone_master: str,
    pipeline: Callable[[PipelineSettings], PipelineProcess],
    tmp_path: Path,
) -> None:
    bootstrap = broker_process.bootstrap_servers
    workload = generate(bootstrap, count=400, seed=31, partitions=2)
    settings = PipelineSettings(
        bootstrap,
        tmp_path / "checkpoint",
        str(tmp_path / "balances.db"),
        master=standalone_master,
        max_offsets=250,
        until_idle_s=4,
    )
    assert pipeline(settings).start().wait(150) == 0, log_tail(tmp_path)

    assert read_balances(settings.db) == workload.expected_balances()
    outputs = read_outputs(bootstrap)
    expected = {payment: 1 for payment in workload.expected_payments()}
    assert dict(outputs.order_status) == dict(outputs.seat_reservations) == expected
    # The executors ran on the workers: each worker's work dir holds the application's executor logs.
    assert all(list((tmp_path / f"worker-{n}").glob("app-*/*/stderr")) for n in range(2))
