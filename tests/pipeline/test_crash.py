"""The pipeline SIGKILLed mid-stream and restarted from its checkpoint: every committed payment counts
once in the balances and appears once on each output topic; aborted input never shows."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.pipeline.events import generate
from onceflow.pipeline.process import PipelineProcess, read_balances, read_outputs, read_progress
from onceflow.pipeline.settings import PipelineSettings
from tests.conftest import BrokerProcess
from tests.pipeline.conftest import PairWatch, log_tail

pytestmark = [pytest.mark.spark, pytest.mark.soak]


@pytest.mark.timeout(300)
def test_kill_and_restart_applies_every_batch_once(
    broker_process: BrokerProcess,
    db: str,
    pipeline: Callable[[PipelineSettings], PipelineProcess],
    tmp_path: Path,
) -> None:
    bootstrap = broker_process.bootstrap_servers
    workload = generate(bootstrap, count=900, seed=11, partitions=2)
    # About four batches per query, so that a kill after the first leaves some to replay.
    settings = PipelineSettings(bootstrap, tmp_path / "checkpoint", db, max_offsets=300, until_idle_s=4)
    watch = PairWatch(bootstrap)
    watch.start()

    running = pipeline(settings).start()
    deadline = time.monotonic() + 90
    while read_progress(db) is None:
        assert running.running(), f"the pipeline ended early:\n{log_tail(tmp_path)}"
        assert time.monotonic() < deadline, f"no progress in the database:\n{log_tail(tmp_path)}"
        time.sleep(0.2)
    running.kill()
    killed_at = read_progress(db)
    assert killed_at is not None
    assert read_balances(db) != workload.expected_balances(), "killed too late: nothing was left to replay"

    assert running.start().wait(120) == 0, log_tail(tmp_path)
    watch.finish()

    assert read_balances(db) == workload.expected_balances()
    outputs = read_outputs(bootstrap)
    expected = {payment: 1 for payment in workload.expected_payments()}
    assert dict(outputs.order_status) == expected
    assert dict(outputs.seat_reservations) == expected
    assert outputs.rejected == workload.expected_rejected()
    assert not watch.violations, watch.violations[:3]
    final = read_progress(db)
    assert final is not None and final.batch_id > killed_at.batch_id
