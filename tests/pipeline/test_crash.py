"""The pipeline SIGKILLed mid-stream and restarted from its checkpoint, with its balances on a real
PostgreSQL server: every committed payment counts once in the balances and appears once on each output
topic; aborted input never shows; and a read_committed reader watching all along never sees a booking
half-written, neither from the batches that finish nor from the one the kill cut short.

(SQLite goes through the same kill and restart in the demo's test, tests/demo/test_demo.py.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from onceflow.pipeline.events import generate
from onceflow.pipeline.process import PipelineProcess, read_balances, read_outputs, read_progress
from onceflow.pipeline.settings import PipelineSettings
from tests.conftest import BrokerProcess
from tests.pipeline.conftest import PairWatch, log_tail
from tests.postgres import PostgresServer

pytestmark = [pytest.mark.spark, pytest.mark.soak, pytest.mark.postgres]


@pytest.mark.timeout(300)
def test_kill_and_restart_applies_every_batch_once_and_never_shows_half_a_booking(
    broker_process: BrokerProcess,
    postgres_server: PostgresServer,
    pipeline: Callable[[PipelineSettings], PipelineProcess],
    tmp_path: Path,
) -> None:
    bootstrap = broker_process.bootstrap_servers
    db = postgres_server.create_database(f"crash_{uuid.uuid4().hex[:16]}")
    workload = generate(bootstrap, count=900, seed=11, partitions=2)
    # About four batches per query: a kill after the first leaves some to replay, and transactions
    # land while the watcher reads.
    settings = PipelineSettings(bootstrap, tmp_path / "checkpoint", db, max_offsets=300, until_idle_s=2)
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
    assert watch.checks > 10, "the watcher hardly ran"
    final = read_progress(db)
    assert final is not None and final.batch_id > killed_at.batch_id
