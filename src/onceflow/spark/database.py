"""Per-account balances from a streaming query into a database, exactly once, with `foreachBatch`.

    sink = BalanceSink("balances.db", "payments-balances")
    payments.select("account", "amount_cents", "topic", "partition", "offset") \\
        .writeStream.foreachBatch(sink).option("checkpointLocation", "hdfs://.../balances").start()

Why this is exactly-once: Spark writes a micro-batch's offsets to the checkpoint's offset log before
it runs the batch, and marks the batch done in the commit log only after `foreachBatch` returns. A
driver that dies in between replays that batch after a restart, with the same batch id and offsets,
so the same rows. Each call applies the batch's balance deltas and the query's progress (batch id and
end offsets) in one database transaction, and the store skips a batch id it already applied. So a
batch is applied whole or not at all, and once: replays, retries and restarts change nothing.

The end offsets stored with a batch come from the batch's own rows, not from the checkpoint, so the
checkpoint may live wherever Spark can keep it (local disk, HDFS, S3): per input partition, one past
the last record of this batch or, for a partition without records in it, the offset stored before.
Rows with a null account count for the offsets only (input that carries no amount).

The query id must be stable across restarts and unique per query writing to the database. A query
started again from an empty checkpoint numbers its batches from 0 again, which the store would skip
as already applied: `check_fresh_start` refuses that case.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from onceflow.spark.options import Offsets, sorted_offsets
from onceflow.stores import BatchStore, StoreError, open_store


def checkpoint_has_batches(spark: SparkSession, checkpoint: str) -> bool:
    """Whether the checkpoint's offset log names a batch, listed through Spark's own Hadoop file
    system, so that it answers for every checkpoint location Spark supports."""
    jvm: Any = spark._jvm  # classic Spark's only door to Hadoop's FileSystem
    offset_log = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/offsets")
    fs = offset_log.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(offset_log):
        return False
    return any(status.getPath().getName().isdigit() for status in fs.listStatus(offset_log))


def check_fresh_start(store: BatchStore, query_id: str, checkpoint: str, has_batches: bool) -> None:
    """Refuse a checkpoint without batches when the database already holds results of the query."""
    progress = store.progress(query_id)
    if progress is not None and not has_batches:
        raise StoreError(
            f"{store.target} already holds query {query_id!r} up to batch {progress.batch_id}, but its "
            f"checkpoint {checkpoint} is empty: restarting from it would skip batches as already applied; "
            "use the original checkpoint, or a new database or query id"
        )


def batch_results(
    groups: Iterable[tuple[str, int, str | None, int | None, int]], before: Mapping[str, Any]
) -> tuple[Offsets, dict[str, int]]:
    """End offsets and balance deltas from (topic, partition, account, amount sum, max offset) groups.

    `before` is the progress stored with the previous batch: a partition this batch has no record of
    keeps its offset, and no offset moves back.
    """
    ends: dict[str, dict[str, int]] = {
        topic: {str(partition): int(offset) for partition, offset in partitions.items()}
        for topic, partitions in before.items()
    }
    deltas: dict[str, int] = {}
    for topic, partition, account, amount, last_offset in groups:
        known = ends.setdefault(topic, {})
        known[str(partition)] = max(known.get(str(partition), 0), last_offset + 1)
        if account is not None and amount is not None:
            deltas[account] = deltas.get(account, 0) + int(amount)
    return sorted_offsets(ends), deltas


class BalanceSink:
    """`foreachBatch(BalanceSink(...))` on rows of (account string, amount in integer cents) with the
    source's topic, partition and offset columns."""

    def __init__(
        self,
        target: str,
        query_id: str,
        account_column: str = "account",
        amount_column: str = "amount_cents",
    ) -> None:
        self.target = target
        self.query_id = query_id
        self.account_column = account_column
        self.amount_column = amount_column

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        # One aggregation, so one Spark job, for both the deltas and the offsets: a few rows per
        # (partition, account), combined here.
        groups = (
            batch.groupBy("topic", "partition", self.account_column)
            .agg(F.sum(self.amount_column).alias("delta"), F.max("offset").alias("last_offset"))
            .collect()
        )
        rows = [
            (row["topic"], row["partition"], row[self.account_column], row["delta"], row["last_offset"])
            for row in groups
        ]
        # Py4J calls back on any of its threads, and a SQLite connection serves only the thread that
        # opened it: a connection per batch, which is cheap next to a micro-batch.
        with open_store(self.target) as store:
            # Batches of one query run one after another, so the progress read here is the previous
            # batch's (or this one's, on a replay, which apply_batch then skips).
            before = store.progress(self.query_id)
            end_offsets, deltas = batch_results(rows, before.end_offsets if before else {})
            store.apply_batch(self.query_id, batch_id, end_offsets, deltas)
