"""The same pipeline command on a Spark standalone cluster: a master and two workers on 127.0.0.1,
one of whose executors is lost, SIGKILLed with its Python workers, in the middle of a micro-batch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from onceflow.pipeline.events import generate
from onceflow.pipeline.process import PipelineProcess, read_balances, read_outputs
from onceflow.pipeline.settings import PipelineSettings
from tests.conftest import BrokerProcess
from tests.pipeline.conftest import log_tail
from tests.spark_cluster import kill_executor_running, standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

# A write task of the exactly-once sink, its rows produced and its transaction still open.
HOLD_POINT = "spark.sink.before-transaction-commit"


@pytest.fixture
def failpoint_dir(tmp_path: Path) -> Path:
    path = tmp_path / "failpoints"
    path.mkdir()
    return path


@pytest.fixture
def standalone_master(tmp_path: Path, failpoint_dir: Path) -> Iterator[str]:
    env = {"ONCEFLOW_FAILPOINTS": HOLD_POINT, "ONCEFLOW_FAILPOINT_DIR": str(failpoint_dir)}
    with standalone_cluster(tmp_path, ("127.0.0.1", "127.0.0.1"), worker_env=env) as url:
        yield url


def executor_logs(tmp_path: Path) -> list[Path]:
    """One stderr per executor ever started, under its worker's work dir."""
    return sorted(tmp_path.glob("worker-*/app-*/*/stderr"))


def wait_until(condition: Callable[[], bool], timeout_s: float, running: PipelineProcess, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert running.running(), f"the pipeline ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout_s:g} s"
        time.sleep(0.2)


@pytest.mark.timeout(230)
def test_pipeline_on_a_standalone_cluster_survives_executor_loss(
    broker_process: BrokerProcess,
    standalone_master: str,
    failpoint_dir: Path,
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
        until_idle_s=2,
    )
    running = pipeline(settings).start()

    # The first write task to reach the point writes its Python worker's pid there and stops.
    held = failpoint_dir / HOLD_POINT
    wait_until(lambda: held.exists() and held.read_text().isdigit(), 120, running, "task at the hold point")
    assert len(executor_logs(tmp_path)) == 2
    kill_executor_running(int(held.read_text()))
    wait_until(lambda: len(executor_logs(tmp_path)) == 3, 60, running, "replacement executor")
    assert running.wait(150) == 0, log_tail(tmp_path)

    assert read_balances(settings.db) == workload.expected_balances()
    outputs = read_outputs(bootstrap)
    expected = {payment: 1 for payment in workload.expected_payments()}
    assert dict(outputs.order_status) == dict(outputs.seat_reservations) == expected
    assert outputs.rejected == workload.expected_rejected()
    # The executors ran on the workers: each worker's work dir holds the application's executor logs.
    assert all(list((tmp_path / f"worker-{n}").glob("app-*/*/stderr")) for n in range(2))
