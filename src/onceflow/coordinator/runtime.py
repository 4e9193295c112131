"""What both coordinators share: their log, append, replay and what to wait on (after Kafka's
`CoordinatorRuntime`).

Write, then apply. An operation reads the coordinator's state and returns a
`CoordinatorResult`: the records to append and the reply. The runtime appends the records and
only then applies them, with the same function that replays them at start-up, so memory never
runs ahead of the log: when the append fails, nothing changed and the caller answers with an
error code. The reply names the log that must be durable before the client hears it; the
broker does the waiting, so a coordinator stays a state machine without an event loop.
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
from onceflow.log.manager import LogManager

_log = logging.getLogger(__name__)

_REPLAY_CHUNK_BYTES = 1 << 20

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

    def replay(self) -> None:
        """Apply every record of the log, in order. A record this coordinator cannot decode
        (ValueError) ends its batch with a warning, as a corrupt batch does."""
        for batch in self.log.batches():
            try:
                for offset, key, value in batch:
                    self._apply(self._decode(key, value), offset)
            except ValueError as error:
                _log.warning("skipping the rest of a batch at %d: %s", batch[0][0], error)

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


class PartitionCoordinatorLog:
    """A coordinator log on partition 0 of an internal topic."""

    def __init__(self, log: PartitionLog) -> None:
        self.partition_log = log

    @classmethod
    def open(cls, logs: LogManager, topic: str, config: dict[str, str]) -> PartitionCoordinatorLog:
        """Partition 0 of `topic`, created with `config` on first start."""
        if topic not in logs.topics:
            logs.create_topic(topic, 1, config)
        log = logs.get(topic, 0)
        assert log is not None
        return cls(log)

    @property
    def durable_log(self) -> PartitionLog:
        return self.partition_log

    def append(self, records: Sequence[KeyValue], now_ms: int) -> int:
        batch = encode_batch(list(records), now_ms)
        return self.partition_log.append(
            batch, [parse_batch_header(batch)], now_ms, coordinator=True
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
    """The error code for a failed coordinator append, as Kafka's TransactionStateManager maps
    it: storage trouble is NOT_COORDINATOR (the client looks the coordinator up again and
    retries), a missing or unavailable log COORDINATOR_NOT_AVAILABLE, and anything else
    (a batch too large, say) UNKNOWN_SERVER_ERROR."""
    if failure.error_code in (ErrorCode.kafka_storage_error, ErrorCode.not_leader_or_follower):
        return ErrorCode.not_coordinator
    if failure.error_code in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
    ):
        return ErrorCode.coordinator_not_available
    return ErrorCode.unknown_server_error
