"""Coordinator logs in memory, for coordinator tests without files or sockets."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from kio.schema.errors import ErrorCode

from onceflow.coordinator.runtime import DurableLog, KeyValue, StoredRecord
from onceflow.coordinator.transaction import TopicPartition, TransactionCoordinator
from onceflow.log.errors import LogAppendError, LogError

DISK_FULL = LogAppendError(ErrorCode.kafka_storage_error, "No space left on device")


class MemoryLog:
    """A `CoordinatorLog` (and `DurableLog`): durable once appended. While `failure` is set,
    every append raises it and appends nothing, as a full disk would."""

    def __init__(self) -> None:
        self.records: list[list[StoredRecord]] = []
        self.log_end_offset = 0
        self.failure: LogError | None = None

    @property
    def flushed_offset(self) -> int:
        return self.log_end_offset

    @property
    def closed(self) -> bool:
        return False

    def flush(self) -> int:
        return self.log_end_offset

    def begin_data_flush(self) -> None:
        return None

    @property
    def durable_log(self) -> DurableLog:
        return self

    def append(self, records: Sequence[KeyValue], now_ms: int) -> int:
        if self.failure is not None:
            raise self.failure
        base_offset = self.log_end_offset
        self.records.append([(base_offset + index, key, value) for index, (key, value) in enumerate(records)])
        self.log_end_offset += len(records)
        return base_offset

    def batches(self) -> Iterator[list[StoredRecord]]:
        yield from self.records


class MemoryPartitions:
    """The broker's side of transactions (`TransactionPartitions`), with markers in a list."""

    def __init__(self, partitions: Sequence[TopicPartition]) -> None:
        self.partitions = set(partitions)
        self.markers: list[tuple[TopicPartition, int, int, bool]] = []
        self.data = MemoryLog()  # the data partitions' log, for the durability waits

    def has_partition(self, partition: TopicPartition) -> bool:
        return partition in self.partitions

    def write_marker(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> DurableLog | None:
        if partition not in self.partitions:
            return None
        if self.data.failure is not None:
            raise self.data.failure
        self.markers.append((partition, producer_id, producer_epoch, commit))
        return self.data

    def complete_offsets(
        self, groups: Iterable[str], producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> Sequence[DurableLog]:
        return []


def finish(coordinator: TransactionCoordinator, transactional_id: str, now_ms: int) -> None:
    """Phase two, run to the end (every log in memory is durable at once)."""
    for _ in coordinator.complete(transactional_id, now_ms):
        pass
