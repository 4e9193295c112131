"""The same pipeline command on a Spark standalone cluster: a master and two workers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from onceflow.pipeline.events import generate
from onceflow.pipeline.process import PipelineProcess, read_balances, read_outputs
from onceflow.pipeline.settings import PipelineSettings
from tests.conftest import BrokerProcess
from tests.pipeline.conftest import log_tail
from tests.spark_cluster import standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


@pytest.fixture
def standalone_master(tmp_path: Path) -> Iterator[str]:
    with standalone_cluster(tmp_path, worker_hosts=("127.0.0.1", "127.0.0.1")) as url:
        yield url


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
