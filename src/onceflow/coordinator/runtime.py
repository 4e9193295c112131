"""What both coordinators share: their log, append, replay and what to wait on (after Kafka's
`CoordinatorRuntime`).

A coordinator is one partition of its internal topic (`__consumer_offsets` or
`__transaction_state`): the broker that leads the partition builds it, replays the partition into
it, and drops it when the leadership goes (`internal_topics` says which partition holds a key).

Write, then apply. An operation reads the coordinator's state and returns a
`CoordinatorResult`: the records to append and the reply. The runtime appends the records and
only then applies them, with the same function that replays them at load, so memory never
runs ahead of the log: when the append fails, nothing changed and the caller answers with an
error code. The reply names the log that must be committed (fsynced, and in a cluster copied by
the partition's ISR) before the client hears it; the broker does the waiting, so a coordinator
stays a state machine without an event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.log.batch import CorruptRecordError, decode_records, encode_batch, parse_batch_header
from onceflow.log.errors import LogAppendError, LogError
from onceflow.log.log import DataFlush, PartitionLog

_log = logging.getLogger(__name__)

_REPLAY_CHUNK_BYTES = 1 << 20
# Records applied between two steps of a load, so that the broker serves meanwhile.
REPLAY_STEP_RECORDS = 2000

# A failpoint, the negative control of the coordinator epoch check: with it armed, partitions
# take the markers of a deposed transaction coordinator, as before coordinators moved.
UNFENCED_MARKERS = "markers.unfenced"

KeyValue = tuple[bytes | None, bytes | None]
StoredRecord = tuple[int, bytes | None, bytes | None]  # offset, key, value


def is_internal(topic: str) -> bool:
    """The coordinators' own logs (`__consumer_offsets`, `__transaction_state`)."""
    return topic.startswith("__")


R = TypeVar("R")  # a coordinator's record type
T = TypeVar("T")  # a reply


class DurableLog(Protocol):
    """A log the broker can fsync and wait on (a `PartitionLog`, or memory in tests)."""

    @property
    def log_end_offset(self) -> int: ...

    @property
    def flushed_offset(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def flush(self) -> int: ...

    def begin_data_flush(self) -> DataFlush | None:
        """The flush as one fdatasync the caller runs, or None: `flush` then."""
        ...


class CoordinatorLog(Protocol):
    """Where a coordinator's records live."""

    @property
    def durable_log(self) -> DurableLog:
        """What to wait on for an append to be durable."""
        ...

    def append(self, records: Sequence[KeyValue], now_ms: int) -> int:
        """Append the records as one batch and return the offset of the first. Raises LogError
        with nothing appended."""
        ...

    def batches(self) -> Iterator[list[StoredRecord]]:
        """Every batch from the start, for replay; corrupt batches are skipped."""
        ...


@dataclass(frozen=True)
class CoordinatorResult(Generic[R, T]):
    """What an operation decided: the records to append (none for a read or a refusal) and
    the reply to give once they are applied."""

    records: Sequence[R]
    reply: T


class CoordinatorRuntime(Generic[R]):
    def __init__(
        self,
        log: CoordinatorLog,
        encode: Callable[[R], KeyValue],
        decode: Callable[[bytes | None, bytes | None], R],
        apply: Callable[[R, int], None],
    ) -> None:
        self.log = log
        self._encode = encode
        self._decode = decode
        self._apply = apply

    @property
    def durable_log(self) -> DurableLog:
        return self.log.durable_log

    def replay(self) -> Iterator[None]:
        """Apply every record of the log, in order, yielding every REPLAY_STEP_RECORDS records
        (the caller goes on when it likes). A record this coordinator cannot decode (ValueError)
        ends its batch with a warning, as a corrupt batch does."""
        applied = 0
        for batch in self.log.batches():
            try:
                for offset, key, value in batch:
                    self._apply(self._decode(key, value), offset)
            except ValueError as error:
                _log.warning("skipping the rest of a batch at %d: %s", batch[0][0], error)
            applied += len(batch)
            if applied >= REPLAY_STEP_RECORDS:
                applied = 0
                yield

    def write(self, records: Sequence[R], now_ms: int) -> None:
        """Append `records`, then apply them. Raises LogError, with nothing applied, when the
        append fails."""
        if not records:
            return
        base_offset = self.append(records, now_ms)
        for index, record in enumerate(records):
            self._apply(record, base_offset + index)

    def append(self, records: Sequence[R], now_ms: int) -> int:
        """Only append; the caller applies. For a record whose live effect is not its replay
        (a group's membership after a rebalance). Raises LogError."""
        try:
            return self.log.append([self._encode(record) for record in records], now_ms)
        except OSError as failure:  # a segment roll that could not create its files, say
            raise LogAppendError(ErrorCode.kafka_storage_error, str(failure)) from failure


def run(steps: Iterator[None]) -> None:
    """Run a load to its end at once."""
    for _ in steps:
        pass


class PartitionCoordinatorLog:
    """A coordinator's log: a partition of its internal topic that this broker leads."""

    def __init__(self, log: PartitionLog, leadership: Callable[[], int | None] = lambda: None) -> None:
        """`leadership()` raises LogAppendError when this broker may not write to the partition
        now (it does not lead it, or its ISR is below min.insync.replicas: nothing is appended
        then), else returns the leader epoch to stamp on the batch (None: none)."""
        self.partition_log = log
        self._leadership = leadership

    @property
    def durable_log(self) -> PartitionLog:
        return self.partition_log

    def append(self, records: Sequence[KeyValue], now_ms: int) -> int:
        leader_epoch = self._leadership()
        batch = encode_batch(list(records), now_ms)
        return self.partition_log.append(
            batch, [parse_batch_header(batch)], now_ms, leader_epoch=leader_epoch, coordinator=True
        ).base_offset

    def batches(self) -> Iterator[list[StoredRecord]]:
        log = self.partition_log
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            data = log.read(offset, _REPLAY_CHUNK_BYTES)
            if not data:
                return
            position = 0
            while position < len(data):
                header = parse_batch_header(data, position)
                batch = data[position : position + header.size]
                position += header.size
                offset = header.last_offset + 1
                try:
                    yield [(record.offset, record.key, record.value) for record in decode_records(batch)]
                except CorruptRecordError as error:
                    _log.warning("skipping a batch at %d of %s: %s", header.base_offset, log.directory, error)


def append_error(failure: LogError) -> ErrorCode:
    """The error code for a failed coordinator append: `write_error` of its code."""
    return write_error(failure.error_code)


def write_error(code: ErrorCode) -> ErrorCode:
    """What the client hears when a coordinator write failed with `code` (appending, or waiting
    for the partition's ISR), as Kafka's TransactionStateManager maps it: storage trouble or a
    lost leadership is NOT_COORDINATOR (the client looks the coordinator up again and retries),
    a missing log or too few replicas in sync COORDINATOR_NOT_AVAILABLE (it retries), and
    anything else (a batch too large, say) UNKNOWN_SERVER_ERROR."""
    if code in (ErrorCode.kafka_storage_error, ErrorCode.not_leader_or_follower, ErrorCode.not_coordinator):
        return ErrorCode.not_coordinator
    if code in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
        ErrorCode.coordinator_not_available,
    ):
        return ErrorCode.coordinator_not_available
    return ErrorCode.unknown_server_error
