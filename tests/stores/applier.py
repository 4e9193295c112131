"""A batch applier in its own process, for the concurrency and crash tests.

python -m tests.stores.applier concurrent TARGET QUERY GO_FILE BATCHES
python -m tests.stores.applier kill-before-commit TARGET QUERY BATCH
python -m tests.stores.applier big TARGET QUERY BATCH ACCOUNTS
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from onceflow.stores import Transaction, open_store


def batch_deltas(batch_id: int, accounts: int = 5) -> dict[str, int]:
    """The same deltas for a batch id in every process, some negative, none zero."""
    return {f"acct-{i}": (-1) ** batch_id * ((batch_id + 1) * 100 + i) for i in range(accounts)}


def batch_offsets(batch_id: int) -> dict[str, dict[str, int]]:
    return {"payments": {"0": 10 * (batch_id + 1), "1": 7 * (batch_id + 1)}}


def total(batch_ids: list[int], accounts: int = 5) -> dict[str, int]:
    sums = dict.fromkeys(batch_deltas(0, accounts), 0)
    for batch_id in batch_ids:
        for account, delta in batch_deltas(batch_id, accounts).items():
            sums[account] += delta
    return sums


def concurrent(target: str, query_id: str, go_file: str, batches: int) -> None:
    """Applies batches 0..batches-1 in order, starting when GO_FILE appears; prints those it applied."""
    with open_store(target) as store:
        print("opened", flush=True)
        while not Path(go_file).exists():
            time.sleep(0.005)
        applied = [
            b for b in range(batches) if store.apply_batch(query_id, b, batch_offsets(b), batch_deltas(b))
        ]
    print(json.dumps(applied))


def kill_before_commit(target: str, query_id: str, batch_id: int) -> None:
    """Writes the whole batch, checks from inside the transaction that it is all there, then dies
    before the commit. Exits 3 instead if the batch was not written, so the test cannot pass by
    killing too early."""
    earlier = list(range(batch_id))

    def die(tx: Transaction) -> None:
        tx.execute("CREATE TABLE audit (batch_id INTEGER)")
        tx.execute("INSERT INTO audit VALUES (?)", (batch_id,))
        balances = dict(tx.execute("SELECT account, balance FROM balances"))
        progress = tx.execute("SELECT batch_id FROM query_progress WHERE query_id = ?", (query_id,))
        if balances != total([*earlier, batch_id]) or progress != [(batch_id,)]:
            sys.exit(3)
        os.kill(os.getpid(), signal.SIGKILL)

    with open_store(target) as store:
        store.apply_batch(query_id, batch_id, batch_offsets(batch_id), batch_deltas(batch_id), write=die)
    sys.exit(4)


def big(target: str, query_id: str, batch_id: int, accounts: int) -> None:
    """Applies one batch over many accounts, saying "ready" just before, for a test to SIGKILL it."""
    deltas = batch_deltas(batch_id, accounts)
    with open_store(target) as store:
        print("ready", flush=True)
        store.apply_batch(query_id, batch_id, batch_offsets(batch_id), deltas)


if __name__ == "__main__":
    command, target, query_id, *rest = sys.argv[1:]
    if command == "concurrent":
        concurrent(target, query_id, rest[0], int(rest[1]))
    elif command == "kill-before-commit":
        kill_before_commit(target, query_id, int(rest[0]))
    elif command == "big":
        big(target, query_id, int(rest[0]), int(rest[1]))
    else:
        sys.exit(f"unknown command {command}")
