"""The pipeline's parts that need no Spark: the workload's expectations, the offset log, restarts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.pipeline.events import make_workload
from onceflow.spark.database import check_fresh_start, planned_offsets
from onceflow.stores import StoreError, open_store


def test_workload_is_seeded_and_expects_only_committed_valid_payments() -> None:
    workload = make_workload(2000, seed=5)
    assert workload == make_workload(2000, seed=5)
    events = [event for txn in workload.transactions for event in txn.events]
    assert len(events) == 2000 and len({event.payment_id for event in events}) == 2000
    assert any(not txn.commit for txn in workload.transactions)
    assert workload.expected_rejected() > 0
    assert not workload.expected_payments() & workload.aborted_payments()
    valid = [event for event in workload.committed() if event.valid]
    assert sum(workload.expected_balances().values()) == sum(event.amount_cents for event in valid)
    for event in valid:
        assert json.loads(event.value)["payment_id"] == event.payment_id


def test_planned_offsets_come_from_the_offset_log(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":0}\n{"payments": {"0": 17}}')
    assert planned_offsets(tmp_path, 3) == {"payments": {"0": 17}}
    (tmp_path / "offsets" / "4").write_text('v1\n{"batchWatermarkMs":0}\n{"a": {"0": 1}}\n{"b": {"0": 2}}')
    with pytest.raises(ValueError, match="one source"):
        planned_offsets(tmp_path, 4)


def test_an_empty_checkpoint_is_refused_once_the_database_holds_results(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    with open_store(str(tmp_path / "balances.db")) as store:
        check_fresh_start(store, "q", checkpoint)  # a first run: nothing applied yet
        store.apply_batch("q", 0, {"payments": {"0": 5}}, {"acct-01": 100})
        with pytest.raises(StoreError, match="would skip batches"):
            check_fresh_start(store, "q", checkpoint)
        (checkpoint / "offsets").mkdir(parents=True)
        (checkpoint / "offsets" / "0").write_text("v1\n{}\n{}")
        check_fresh_start(store, "q", checkpoint)  # the original checkpoint: a restart
        check_fresh_start(store, "other-query", tmp_path / "elsewhere")


def test_a_bad_database_target_is_one_readable_line(tmp_path: Path) -> None:
    command = ["pipeline", "run", "--bootstrap", "127.0.0.1:1", "--checkpoint", str(tmp_path / "ckpt")]
    run = subprocess.run(
        [sys.executable, "-m", "onceflow.cli", *command, "--db", "foo://bar"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert run.stderr.strip() == (
        "onceflow pipeline: unknown store target 'foo://bar': use a SQLite file path, sqlite:///path or "
        "postgresql://..."
    )
