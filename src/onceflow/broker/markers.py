"""The broker's side of a transaction (`TransactionPartitions`) for one transaction coordinator:
which data partitions exist, the COMMIT and ABORT markers on them, and the offsets the
transaction staged at its groups' coordinators. Every marker carries the coordinator's epoch
(the leader epoch at which this broker took its partition of `__transaction_state`).

The transaction coordinator decides when each is written (phase two, `complete`); this only does
the writing. A partition this broker leads alone is written at once, and the step waits for its
fsync; any other marker goes to the partition's current leader (`MarkerWriter`), until written.
The offsets of a group are settled the same way, by a marker for the partition of
`__consumer_offsets` that holds the group, which its leader's group coordinator applies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from onceflow.broker.txn_markers import CoordinatorFencedError, append_marker
from onceflow.coordinator.transaction import Awaited, TopicPartition
from onceflow.internal_topics import CONSUMER_OFFSETS_TOPIC

if TYPE_CHECKING:
    from onceflow.broker.core import Broker

__all__ = ["BrokerTransactionPartitions", "CoordinatorFencedError"]


class BrokerTransactionPartitions:
    def __init__(self, broker: Broker, coordinator_epoch: int, current: Callable[[], bool]) -> None:
        """`current()`: whether the coordinator still holds its partition (a deposed one stops
        retrying its markers: its successor writes them)."""
        self._broker = broker
        self._coordinator_epoch = coordinator_epoch
        self._current = current

    def has_partition(self, partition: TopicPartition) -> bool:
        return self._broker.partition_exists(partition)

    def write_marker(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> Awaited | None:
        if not self._broker.partition_exists(partition):
            return None  # deleted meanwhile: nothing left to mark
        return self._write(partition, producer_id, producer_epoch, commit, now_ms)

    def complete_offsets(
        self, groups: Iterable[str], producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> list[Awaited]:
        shards = self._broker.groups
        partitions = sorted({index for group in groups if (index := shards.partition_of(group)) is not None})
        written = []
        for index in partitions:
            marked = self._write((CONSUMER_OFFSETS_TOPIC, index), producer_id, producer_epoch, commit, now_ms)
            if marked is not None:
                written.append(marked)
        return written

    def _write(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> Awaited | None:
        """At once when this broker leads the partition alone (raising LogError: the transaction
        stays prepared, and is tried again); else a task that ends once its leader has it."""
        broker = self._broker
        replica = broker.partition(*partition)
        if replica is not None and replica.is_leader and len(replica.replicas) == 1:
            logs = append_marker(
                broker, partition, producer_id, producer_epoch, commit, self._coordinator_epoch, now_ms
            )
            return logs[0] if logs else None
        return broker.markers.write(
            partition, producer_id, producer_epoch, commit, self._coordinator_epoch, self._current
        )
