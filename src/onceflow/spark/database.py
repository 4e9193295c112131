"""Per-account balances from a streaming query into a database, exactly once, with `foreachBatch`.

    sink = BalanceSink("balances.db", "payments-balances", checkpoint="ckpt/balances")
    payments.select("account", "amount_cents").writeStream.foreachBatch(sink) \\
        .option("checkpointLocation", "ckpt/balances").start()

Why this is exactly-once: Spark writes a micro-batch's offsets to the checkpoint's offset log before
it runs the batch, and marks the batch done in the commit log only after `foreachBatch` returns. A
driver that dies in between replays that batch after a restart, with the same batch id and offsets,
so the same rows. Each call applies the batch's balance deltas and the query's progress (batch id and
end offsets) in one database transaction, and the store skips a batch id it already applied. So a
batch is applied whole or not at all, and once: replays, retries and restarts change nothing.

The end offsets stored with a batch are the ones Spark planned, read from the offset log: they say
where the results stop in the input, including gaps left by transaction markers and aborted records.
This needs the checkpoint on a file system the driver can read, and a query with one source.

The query id must be stable across restarts and unique per query writing to the database. A query
started again from an empty checkpoint numbers its batches from 0 again, which the store would skip
as already applied: `check_fresh_start` refuses that case.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow.stores import BatchStore, StoreError, open_store


def planned_offsets(checkpoint: str | Path, batch_id: int) -> dict[str, Any]:
    """The end offsets of batch `batch_id` from the checkpoint's offset log.

    The file is "v1", a line of batch metadata, then one line per source: its offsets as JSON.
    """
    path = Path(checkpoint) / "offsets" / str(batch_id)
    lines = path.read_text().splitlines()
    if len(lines) != 3 or lines[0] != "v1":
        raise ValueError(f"{path}: expected a v1 offset log entry of a query with one source")
    offsets: dict[str, Any] = json.loads(lines[2])
    return offsets


def check_fresh_start(store: BatchStore, query_id: str, checkpoint: str | Path) -> None:
    """Refuse a checkpoint without batches when the database already holds results of the query."""
    progress = store.progress(query_id)
    offset_log = Path(checkpoint) / "offsets"
    if progress is not None and not (offset_log.is_dir() and any(offset_log.iterdir())):
        raise StoreError(
            f"{store.target} already holds query {query_id!r} up to batch {progress.batch_id}, but its "
            f"checkpoint {checkpoint} is empty: restarting from it would skip batches as already applied; "
            "use the original checkpoint, or a new database or query id"
        )


class BalanceSink:
    """`foreachBatch(BalanceSink(...))` on rows of (account string, amount in integer cents)."""

    def __init__(
        self,
        target: str,
        query_id: str,
        checkpoint: str | Path,
        account_column: str = "account",
        amount_column: str = "amount_cents",
    ) -> None:
        self.target = target
        self.query_id = query_id
        self.checkpoint = checkpoint
        self.account_column = account_column
        self.amount_column = amount_column

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        totals = batch.groupBy(self.account_column).agg(F.sum(self.amount_column).alias("delta")).collect()
        deltas = {row[self.account_column]: int(row["delta"]) for row in totals}
        end_offsets = planned_offsets(self.checkpoint, batch_id)
        # Py4J calls back on any of its threads, and a SQLite connection serves only the thread that
        # opened it: a connection per batch, which is cheap next to a micro-batch.
        with open_store(self.target) as store:
            store.apply_batch(self.query_id, batch_id, end_offsets, deltas)
