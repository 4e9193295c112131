"""Shared fixtures: brokers on 127.0.0.1, in-process or as a real process."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from onceflow import EmbeddedBroker
from onceflow.cluster.ports import start_on_a_restartable_port
from onceflow.faults.broker_process import wait_until as wait_until  # the tests import it from here
from tests.postgres import PostgresServer

# `make test` runs on four pytest-xdist workers (most tests wait on clients, timers and fsyncs).
# The Spark test files run in one lane, in turn on one worker: Spark's Python workers must connect
# back within 10 s, which two Spark jobs side by side on two cores sometimes miss. The lane is the
# suite's longest, so it starts first; the other workers take the other files, a file at a time,
# so that a module's fixtures start once.
SPARK_LANES = {
    "tests/demo/test_demo.py": "spark",
    "tests/pipeline/test_crash.py": "spark",
    "tests/pipeline/test_standalone.py": "spark",
    "tests/spark/test_daemon.py": "spark",
    "tests/spark/test_data_source.py": "spark",
    "tests/spark/test_kill_restart.py": "spark",
    "tests/spark/test_secured.py": "spark",
}


def spark_lane(nodeid: str) -> str | None:
    return SPARK_LANES.get(nodeid.split("::")[0])


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Scopes are the Spark lane, and each other test file, in the order collected, where the
    Spark lane comes first and the long runs next (not xdist's default, the scopes with the most
    tests first).
    (pytest-xdist's own `loadgroup` does not group under pytest 9: it renames nodes, which
    pytest 9 ignores.)"""

    class SparkLaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return spark_lane(nodeid) or nodeid.split("::")[0]

        def remove_node(self, node: Any) -> str | None:
            """A crashed worker's test is reported as crashed and is not handed to another
            worker, which loadscope would do with its scope's unfinished tests (the run stops
            after a crash: `--max-worker-restart=0` in pyproject.toml)."""
            units = self.assigned_work.get(node, {}).values()
            crashed = next((nodeid for unit in units for nodeid, done in unit.items() if not done), None)
            for unit in units:
                if crashed in unit:
                    unit[crashed] = True
            super().remove_node(node)
            return crashed

    config.option.loadscopereorder = False
    return SparkLaneScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if bool(item.get_closest_marker("spark")) != bool(spark_lane(item.nodeid)):
            raise pytest.UsageError(f"{item.nodeid}: Spark tests, and only they, belong in SPARK_LANES")
    # Stable: the Spark lane, then the long runs (soak), then the rest, so no long file starts last.
    items.sort(key=lambda item: (spark_lane(item.nodeid) is None, item.get_closest_marker("soak") is None))


# pytest-timeout's alarm runs Python code, so it needs the GIL: a test stuck in C code that holds
# it (librdkafka closing a consumer inside a rebalance callback, waiting for a broker that runs in
# the same process) would stall the suite until CI gives up. faulthandler's watchdog is a thread
# of C that needs no GIL: past the test's timeout and this margin it prints every thread's stack
# and ends the worker, which pytest-xdist reports as crashed.
HUNG_MARGIN_S = 60


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    marker = item.get_closest_marker("timeout")
    timeout_s = float(marker.args[0] if marker and marker.args else item.config.getini("timeout"))
    faulthandler.dump_traceback_later(timeout_s + HUNG_MARGIN_S, exit=True)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh SQLite file, or a fresh database on a real PostgreSQL server on 127.0.0.1."""
    if request.param == "sqlite":
        return str(tmp_path / "results.db")
    # Looked up here so that a run of only the SQLite cases starts no server.
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"test_{uuid.uuid4().hex[:16]}")


# Test brokers let a new group's first member in at once instead of after Kafka's 3 s.
FAST_JOINS = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tmp_path / "data", config=FAST_JOINS) as running:
        yield running


class BrokerProcess:
    """`onceflow broker` in its own process, so that tests can SIGKILL it."""

    def __init__(
        self,
        data_dir: Path,
        port: int = 0,
        settings: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        self.settings = {**FAST_JOINS, **(settings or {})}
        self.env = env or {}
        self.extra_args: list[str] = []
        self.process: subprocess.Popen[str] | None = None
        self.metrics_url: str | None = None  # with `--metrics HOST:PORT` among the extra args

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        if self.port:  # a restart: the port its clients know
            return self._start_on(self.port)
        # Its first start: a port it can have again after a SIGKILL.
        return start_on_a_restartable_port(self._start_on)

    def _start_on(self, port: int) -> BrokerProcess:
        self.port = port
        command = [
            sys.executable,
            "-m",
            "onceflow.cli",
            "broker",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--data-dir",
            str(self.data_dir),
        ]
        command += self.extra_args
        for key, value in self.settings.items():
            command += ["--set", f"{key}={value}"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, text=True, env={**os.environ, **self.env}
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise RuntimeError(f"broker did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        if "--metrics" in self.extra_args:
            line = self.process.stdout.readline().strip()
            self.metrics_url = line.removeprefix("onceflow broker metrics on ")
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(timeout=30)

    def restart(self) -> BrokerProcess:
        self.kill()
        return self.start()


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "data").start()
    yield process
    if process.process is not None and process.process.poll() is None:
        process.process.kill()
        process.process.wait(timeout=30)


os.environ.setdefault("PYTHONUNBUFFERED", "1")
