"""The broker's side of a transaction (`TransactionPartitions`): which data partitions exist,
the COMMIT and ABORT markers on them, and the group offsets the transaction staged.

The transaction coordinator decides when each is written (phase two, `complete`); this only
does the writing: on one broker by appending, in a cluster by asking each partition's leader
(`ClusterMarkers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from onceflow.broker.txn_markers import COORDINATOR_EPOCH, ClusterMarkers
from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.runtime import DurableLog
from onceflow.coordinator.transaction import Awaited, TopicPartition
from onceflow.log.batch import encode_control_batch, validate_batches
from onceflow.log.manager import LogManager


class BrokerTransactionPartitions:
    def __init__(
        self,
        logs: LogManager,
        groups: GroupCoordinator,
        cluster: ClusterMarkers | None,
        exists: Callable[[TopicPartition], bool],
    ) -> None:
        """`exists`: whether a partition exists (`Broker.partition_exists`)."""
        self._logs = logs
        self._groups = groups
        self._cluster = cluster
        self.has_partition = exists

    def write_marker(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> Awaited | None:
        if self._cluster is not None:
            return self._cluster.write(partition, producer_id, producer_epoch, commit)
        partition_log = self._logs.get(*partition)
        if partition_log is None:
            return None
        marker = encode_control_batch(producer_id, producer_epoch, commit, COORDINATOR_EPOCH, now_ms)
        partition_log.append(marker, validate_batches(marker), now_ms)
        return partition_log

    def complete_offsets(self, producer_id: int, commit: bool, now_ms: int) -> Sequence[DurableLog]:
        return self._groups.complete_transaction(producer_id, commit, now_ms)
