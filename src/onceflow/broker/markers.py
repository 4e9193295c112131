"""The broker's side of a transaction (`TransactionPartitions`): which data partitions exist,
the COMMIT and ABORT markers on them, and the group offsets the transaction staged.

The transaction coordinator decides when each is written (phase two, `complete`); this only
does the appending.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.runtime import DurableLog
from onceflow.coordinator.transaction import TopicPartition
from onceflow.log.batch import encode_control_batch, validate_batches
from onceflow.log.manager import LogManager

COORDINATOR_EPOCH = 0  # one broker: the coordinator never moves


class BrokerTransactionPartitions:
    def __init__(
        self, logs: LogManager, groups: GroupCoordinator, led_elsewhere: Callable[[str, int], bool]
    ) -> None:
        """`led_elsewhere(topic, partition)`: in a cluster, whether another broker leads it. Such
        a partition is not this coordinator's to write: a marker in a follower's replica would
        make it diverge from its leader (transactions across brokers are not supported)."""
        self._logs = logs
        self._groups = groups
        self._led_elsewhere = led_elsewhere

    def has_partition(self, partition: TopicPartition) -> bool:
        return self._logs.get(*partition) is not None and not self._led_elsewhere(*partition)

    def write_marker(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> DurableLog | None:
        partition_log = self._logs.get(*partition)
        if partition_log is None or self._led_elsewhere(*partition):
            return None
        marker = encode_control_batch(producer_id, producer_epoch, commit, COORDINATOR_EPOCH, now_ms)
        partition_log.append(marker, validate_batches(marker), now_ms)
        return partition_log

    def complete_offsets(self, producer_id: int, commit: bool, now_ms: int) -> Sequence[DurableLog]:
        return self._groups.complete_transaction(producer_id, commit, now_ms)
