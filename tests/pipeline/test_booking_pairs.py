"""A read_committed reader never sees a booking half-written while the pipeline runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.pipeline.events import generate
from onceflow.pipeline.process import PipelineProcess, read_outputs
from onceflow.pipeline.settings import PipelineSettings
from tests.conftest import BrokerProcess
from tests.pipeline.conftest import PairWatch, log_tail

pytestmark = pytest.mark.spark


@pytest.mark.timeout(170)
def test_order_status_and_seat_reservation_appear_together(
    broker_process: BrokerProcess, pipeline: Callable[[PipelineSettings], PipelineProcess], tmp_path: Path
) -> None:
    bootstrap = broker_process.bootstrap_servers
    workload = generate(bootstrap, count=600, seed=21, partitions=2)
    watch = PairWatch(bootstrap)
    watch.start()
    # Small batches: many transactions land while the watcher reads.
    settings = PipelineSettings(
        bootstrap, tmp_path / "checkpoint", str(tmp_path / "balances.db"), max_offsets=100, until_idle_s=4
    )
    assert pipeline(settings).start().wait(150) == 0, log_tail(tmp_path)
    watch.finish()

    assert not watch.violations, watch.violations[:3]
    assert watch.checks > 10, "the watcher hardly ran"
    outputs = read_outputs(bootstrap)
    assert set(outputs.order_status) == set(outputs.seat_reservations) == workload.expected_payments()
