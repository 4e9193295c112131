"""A Spark standalone cluster on this machine: a master and workers started from the pyspark package."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pyspark

from onceflow.pipeline.driver import driver_env, jvm_options
from onceflow.sessions import kill_session, stat_fields

SPARK_HOME = Path(pyspark.__file__).parent
# Spark binds and advertises 127.0.0.1 only; drivers start as the pipeline's do, and on a test
# cluster its daemons and the executors with the same JVM options (0.46 x the time to start a
# master and two workers, 4.1 s against 8.3-9.3 s).
SHORT_RUN_JVM = jvm_options()
_DRIVER_ENV = driver_env()
SPARK_ENV = {
    **_DRIVER_ENV,
    "PYSPARK_SUBMIT_ARGS": f"--conf 'spark.executor.extraJavaOptions={SHORT_RUN_JVM}' "
    + _DRIVER_ENV["PYSPARK_SUBMIT_ARGS"],
}


class Daemon:
    """A Spark master or worker JVM (`bin/spark-class`), in a session of its own with its executors."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: Mapping[str, str]) -> None:
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={
                    **os.environ,
                    **SPARK_ENV,
                    "SPARK_HOME": str(SPARK_HOME),
                    "SPARK_DAEMON_JAVA_OPTS": SHORT_RUN_JVM,
                    **env,
                },
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
        kill_session(self.process.pid)
        self.process.wait(30)


@contextmanager
def standalone_cluster(
    log_dir: Path, worker_hosts: Sequence[str], worker_env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """The master URL of a cluster with one one-core worker per host name; all killed afterwards.

    The workers' executors, and their Python workers, inherit `worker_env`.

    Host names, not addresses: "localhost" and "127.0.0.1" are the same loopback address, but
    Spark takes them for two machines, which speculation needs (it never runs a copy of a task
    on a host that already runs one).
    """
    master_args = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
    daemons = [Daemon("master", ["org.apache.spark.deploy.master.Master", *master_args], log_dir, {})]
    try:
        url = daemons[0].wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
        for number, host in enumerate(worker_hosts):
            work_dir = log_dir / f"worker-{number}"
            work_dir.mkdir()
            worker_args = ["--host", host, "--webui-port", "0", "--cores", "1", "--memory", "1g"]
            worker_args += ["--work-dir", str(work_dir), url]
            daemons.append(
                Daemon(
                    f"worker-{number}",
                    ["org.apache.spark.deploy.worker.Worker", *worker_args],
                    log_dir,
                    worker_env or {},
                )
            )
        for worker in daemons[1:]:
            worker.wait_for("Successfully registered with master")
        yield url
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def _stat(pid: int) -> tuple[int, int] | None:
    """The parent's pid and the process group, None when the process is gone."""
    fields = stat_fields(Path(f"/proc/{pid}/stat"))
    return None if fields is None else (int(fields[1]), int(fields[2]))


def _processes() -> dict[int, tuple[int, int]]:
    """Each live process's parent and process group."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:  # not gone meanwhile
            found[int(entry.name)] = stat
    return found


def _descendants(pid: int, processes: dict[int, tuple[int, int]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, (parent, _) in processes.items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_executor_running(pid: int) -> int:
    """SIGKILL the executor JVM that `pid` (a Python worker of a task) runs under, with all its
    Python workers and whatever they started, as a lost machine would; the executor JVM's pid."""
    processes = _processes()
    executor = pid
    while b"CoarseGrainedExecutorBackend" not in Path(f"/proc/{executor}/cmdline").read_bytes():
        parent = processes.get(executor, (None, None))[0]
        assert parent is not None and parent > 1, f"process {pid} runs under no Spark executor"
        executor = parent
    # Listed before the kill: a dead JVM's children move to another parent. PySpark's daemon leads a
    # process group of its own, which keeps what its workers started (the sink's slot keeper) even
    # once the worker that started it is gone.
    victims = {executor, *_descendants(executor, processes)}
    groups = {processes[victim][1] for victim in victims if victim in processes} - {processes[executor][1]}
    victims |= {process for process, (_, group) in processes.items() if group in groups}
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    return executor
