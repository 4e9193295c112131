"""The pipeline's parts that need no Spark: the workload's expectations, a batch's results, restarts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.pipeline.events import make_workload
from onceflow.spark.database import batch_results, check_fresh_start
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


def test_a_batch_ends_one_past_its_last_record_and_keeps_the_partitions_it_did_not_read() -> None:
    before = {"payments": {"0": 10, "1": 7}}
    groups = [
        ("payments", 0, "acct-01", 300, 12),
        ("payments", 0, "acct-02", 50, 14),
        ("payments", 0, None, None, 19),  # invalid input: no amount, but read all the same
        ("payments", 2, "acct-01", 25, 3),  # a partition new since the previous batch
    ]
    offsets, deltas = batch_results(groups, before)
    assert offsets == {"payments": {"0": 20, "1": 7, "2": 4}}
    assert list(offsets["payments"]) == ["0", "1", "2"]
    assert deltas == {"acct-01": 325, "acct-02": 50}
    # A replay of an applied batch reads the same rows again: nothing moves back.
    assert batch_results(groups[:1], offsets)[0] == offsets


def test_an_empty_checkpoint_is_refused_once_the_database_holds_results(tmp_path: Path) -> None:
    checkpoint = str(tmp_path / "checkpoint")
    with open_store(str(tmp_path / "balances.db")) as store:
        check_fresh_start(store, "q", checkpoint, has_batches=False)  # a first run: nothing applied yet
        store.apply_batch("q", 0, {"payments": {"0": 5}}, {"acct-01": 100})
        with pytest.raises(StoreError, match="would skip batches"):
            check_fresh_start(store, "q", checkpoint, has_batches=False)
        check_fresh_start(store, "q", checkpoint, has_batches=True)  # the original checkpoint: a restart
        check_fresh_start(store, "other-query", str(tmp_path / "elsewhere"), has_batches=False)


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
