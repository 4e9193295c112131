"""Phase two of a transaction: the markers, then Complete*.

Runs on the event loop. Each step waits for the previous one to be durable, so a crash
at any point leaves a state that the restart finishes in the decided direction: Prepare*
is in the transaction log before any marker, and Complete* only after every marker and
every transactional offset is fsynced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow import failpoints
from onceflow.coordinator.transaction import TxnState
from onceflow.log.batch import encode_control_batch, validate_batches
from onceflow.log.log import PartitionLog

if TYPE_CHECKING:
    from onceflow.broker.core import Broker

COORDINATOR_EPOCH = 0  # one broker: the coordinator never moves


async def write_markers(broker: Broker, transactional_id: str, now_ms: int) -> None:
    coordinator = broker.transactions
    metadata = coordinator.transactions[transactional_id]
    commit = metadata.state == TxnState.PREPARE_COMMIT
    await broker.wait_durable([coordinator.log])
    failpoints.reach("txn.after-prepare")

    written: list[PartitionLog] = []
    for topic, partition in sorted(metadata.partitions):
        partition_log = broker.logs.get(topic, partition)
        if partition_log is None:
            continue  # deleted meanwhile: nothing left to mark
        marker = encode_control_batch(
            metadata.producer_id, metadata.producer_epoch, commit, COORDINATOR_EPOCH, now_ms
        )
        # A failure (LogError) ends this attempt; Broker logs it and the sweep tries again.
        partition_log.append(marker, validate_batches(marker), now_ms)
        written.append(partition_log)
        if len(written) == 1 and failpoints.armed("txn.between-markers"):
            partition_log.flush()  # so the crash really comes between a durable marker and the rest
            failpoints.reach("txn.between-markers")
    written += broker.groups.complete_transaction(metadata.producer_id, commit, now_ms)
    broker.appended(written)
    await broker.wait_durable(written)
    failpoints.reach("txn.before-complete")

    coordinator.complete(transactional_id, now_ms)
    await broker.wait_durable([coordinator.log])
