"""Appliers in separate processes: racing each other, and SIGKILLed in the middle of a batch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from onceflow.stores import BatchStore, Transaction, open_store
from tests.stores.applier import batch_deltas, batch_offsets, total

QUERY = "query-1"
ROOT = Path(__file__).parents[2]


def applier(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.stores.applier", *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def test_two_processes_racing_through_the_same_batches_apply_each_once(target: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    batches = 40
    racers = [applier("concurrent", target, QUERY, str(go), str(batches)) for _ in range(2)]
    for racer in racers:  # both have opened the store, racing to create its tables, before the start
        assert racer.stdout is not None and racer.stdout.readline() == "opened\n"
    go.touch()
    applied = []
    for racer in racers:
        out, _ = racer.communicate(timeout=120)
        assert racer.returncode == 0
        applied.append(json.loads(out))
    assert sorted(applied[0] + applied[1]) == list(range(batches))
    with open_store(target) as store:
        assert store.balances() == total(list(range(batches)))
        progress = store.progress(QUERY)
        assert progress is not None and progress.batch_id == batches - 1


def test_a_process_killed_before_commit_leaves_none_of_its_batch(store: BatchStore) -> None:
    assert store.apply_batch(QUERY, 0, batch_offsets(0), batch_deltas(0))
    # The child writes all of batch 1 (balances, progress, an audit table), checks it from inside its
    # transaction, then SIGKILLs itself; exit code 3 means it found the batch not written.
    child = applier("kill-before-commit", store.target, QUERY, "1")
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL

    with open_store(store.target) as reopened:
        assert reopened.balances() == total([0])
        progress = reopened.progress(QUERY)
        assert progress is not None and progress.batch_id == 0

        def audit(tx: Transaction) -> None:
            tx.execute("CREATE TABLE audit (batch_id INTEGER)")  # fails if the killed attempt left it

        assert reopened.apply_batch(QUERY, 1, batch_offsets(1), batch_deltas(1), write=audit)
        assert reopened.balances() == total([0, 1])


def test_a_big_batch_killed_at_any_moment_is_all_there_or_not_at_all(store: BatchStore) -> None:
    accounts = 20_000
    started = time.monotonic()
    assert store.apply_batch(QUERY, 0, batch_offsets(0), batch_deltas(0, accounts))
    duration = time.monotonic() - started
    applied = [0]
    for fraction in (0.1, 0.4, 0.7, 1.0):
        batch_id = applied[-1] + 1
        child = applier("big", store.target, QUERY, str(batch_id), str(accounts))
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(duration * fraction)
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)

        progress = store.progress(QUERY)
        assert progress is not None and progress.batch_id in (applied[-1], batch_id)
        if progress.batch_id == batch_id:
            applied.append(batch_id)
        assert store.balances() == total(applied, accounts)
