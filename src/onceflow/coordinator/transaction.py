"""The transaction coordinator: a state machine replayed from its own log.

Every transition is appended to `__transaction_state` before it is acted on (the caller
waits for that append to be durable before answering or writing markers), and a restart
replays the log: the last record of a transactional id is its state. A transaction left
in Prepare* by a crash is completed after the restart (`pending_completions`).

States and transitions follow docs/design.md#transaction-states (Kafka's transaction
protocol v1). Fencing an open transaction (InitProducerId while Ongoing, or a timeout) bumps
the epoch and writes PrepareAbort with the new epoch directly; its markers then fence the old
session on every partition.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from onceflow.log.batch import decode_records, encode_batch, validate_batches
from onceflow.log.log import PartitionLog
from onceflow.log.manager import LogManager

TRANSACTION_LOG = "__transaction_state"
# An epoch is an int16; Kafka issues a new producer id before the epoch would reach the top.
MAX_EPOCH = 32766
_REPLAY_CHUNK = 1 << 20

TopicPartition = tuple[str, int]


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    # Kafka's Dead and PrepareEpochFence are not used: expiry writes a tombstone, and fencing
    # writes PrepareAbort with the bumped epoch.

    @property
    def is_prepared(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    last_producer_id: int = -1
    last_producer_epoch: int = -1
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    start_ms: int = -1  # when the open transaction began
    update_ms: int = -1

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 0,
                "producer_id": self.producer_id,
                "producer_epoch": self.producer_epoch,
                "last_producer_id": self.last_producer_id,
                "last_producer_epoch": self.last_producer_epoch,
                "timeout_ms": self.timeout_ms,
                "state": self.state.value,
                "partitions": sorted(self.partitions),
                "groups": sorted(self.groups),
                "start_ms": self.start_ms,
                "update_ms": self.update_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, transactional_id: str, value: bytes) -> TransactionMetadata:
        fields = json.loads(value)
        return cls(
            transactional_id,
            fields["producer_id"],
            fields["producer_epoch"],
            fields["timeout_ms"],
            TxnState(fields["state"]),
            fields["last_producer_id"],
            fields["last_producer_epoch"],
            {(topic, partition) for topic, partition in fields["partitions"]},
            set(fields["groups"]),
            fields["start_ms"],
            fields["update_ms"],
        )


@dataclass(frozen=True)
class InitResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1
    # Set when the call fenced an open transaction whose markers must now be written.
    fenced: str | None = None


class TransactionCoordinator:
    def __init__(
        self,
        logs: LogManager,
        allocate_producer_id: Callable[[], int],
        max_timeout_ms: int,
        id_expiration_ms: int,
    ) -> None:
        self._logs = logs
        self._allocate_producer_id = allocate_producer_id
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms
        if TRANSACTION_LOG not in logs.topics:
            logs.create_topic(TRANSACTION_LOG, 1, {"retention.ms": "-1", "retention.bytes": "-1"})
        log = logs.get(TRANSACTION_LOG, 0)
        assert log is not None
        self.log: PartitionLog = log
        self.transactions: dict[str, TransactionMetadata] = {}
        self._by_producer_id: dict[int, TransactionMetadata] = {}
        self._replay()

    # -- the log ------------------------------------------------------------------------------

    def _replay(self) -> None:
        offset = self.log.log_start_offset
        while batches := self.log.read(offset, _REPLAY_CHUNK):
            position = 0
            for header in validate_batches(batches):
                for record in decode_records(batches[position : position + header.size]):
                    assert record.key is not None
                    transactional_id = record.key.decode()
                    if record.value is None:
                        self._forget(transactional_id)
                    else:
                        self._remember(TransactionMetadata.decode(transactional_id, record.value))
                position += header.size
                offset = header.last_offset + 1

    def _write(self, metadata: TransactionMetadata, now_ms: int) -> None:
        """Append the new state of a transaction; the caller waits for `self.log` to be durable."""
        metadata.update_ms = now_ms
        self._append(metadata.transactional_id, metadata.encode(), now_ms)
        self._remember(metadata)

    def _append(self, transactional_id: str, value: bytes | None, now_ms: int) -> None:
        batch = encode_batch([(transactional_id.encode(), value)], now_ms)
        self.log.append(batch, validate_batches(batch), now_ms)

    def _remember(self, metadata: TransactionMetadata) -> None:
        previous = self.transactions.get(metadata.transactional_id)
        if previous is not None:
            self._by_producer_id.pop(previous.producer_id, None)
        self.transactions[metadata.transactional_id] = metadata
        self._by_producer_id[metadata.producer_id] = metadata

    def _forget(self, transactional_id: str) -> None:
        metadata = self.transactions.pop(transactional_id, None)
        if metadata is not None:
            self._by_producer_id.pop(metadata.producer_id, None)

    # -- InitProducerId -----------------------------------------------------------------------

    def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int, now_ms: int
    ) -> InitResult:
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return InitResult(ErrorCode.invalid_transaction_timeout)
        metadata = self.transactions.get(transactional_id)
        if metadata is None:
            metadata = TransactionMetadata(transactional_id, self._allocate_producer_id(), 0, timeout_ms)
            self._write(metadata, now_ms)
            return InitResult(ErrorCode.none, metadata.producer_id, metadata.producer_epoch)
        if metadata.state.is_prepared:
            return InitResult(ErrorCode.concurrent_transactions)
        if metadata.state == TxnState.ONGOING:
            # The old session may still be alive: fence it and abort what it left open.
            self._fence_and_abort(metadata, now_ms)
            return InitResult(ErrorCode.concurrent_transactions, fenced=transactional_id)
        if producer_id >= 0:
            # KIP-360: the caller names its session. The one just replaced is a retry of a bump
            # whose answer was lost; anything but that or the current one is a fenced zombie.
            caller = (producer_id, producer_epoch)
            if caller == (metadata.last_producer_id, metadata.last_producer_epoch):
                return InitResult(ErrorCode.none, metadata.producer_id, metadata.producer_epoch)
            if caller != (metadata.producer_id, metadata.producer_epoch):
                return InitResult(ErrorCode.producer_fenced)
        self._bump_epoch(metadata)
        metadata.timeout_ms = timeout_ms
        metadata.state = TxnState.EMPTY
        metadata.partitions.clear()
        metadata.groups.clear()
        metadata.start_ms = -1
        self._write(metadata, now_ms)
        return InitResult(ErrorCode.none, metadata.producer_id, metadata.producer_epoch)

    def _bump_epoch(self, metadata: TransactionMetadata) -> None:
        metadata.last_producer_id = metadata.producer_id
        metadata.last_producer_epoch = metadata.producer_epoch
        if metadata.producer_epoch >= MAX_EPOCH:
            self._by_producer_id.pop(metadata.producer_id, None)
            metadata.producer_id = self._allocate_producer_id()
            metadata.producer_epoch = 0
        else:
            metadata.producer_epoch += 1

    def _fence_and_abort(self, metadata: TransactionMetadata, now_ms: int) -> None:
        # The markers carry the bumped epoch, which fences the old one on every partition. The
        # bump is not a new session, so the last epoch keeps naming the one before it.
        last = (metadata.last_producer_id, metadata.last_producer_epoch)
        self._bump_epoch(metadata)
        metadata.last_producer_id, metadata.last_producer_epoch = last
        metadata.state = TxnState.PREPARE_ABORT
        self._write(metadata, now_ms)

    # -- the transaction ----------------------------------------------------------------------

    def _check_session(self, transactional_id: str, producer_id: int, producer_epoch: int) -> ErrorCode:
        metadata = self.transactions.get(transactional_id)
        if metadata is None or metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if metadata.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced
        if metadata.state.is_prepared:
            return ErrorCode.concurrent_transactions
        return ErrorCode.none

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        now_ms: int,
    ) -> dict[TopicPartition, ErrorCode]:
        wanted = list(partitions)
        error = self._check_session(transactional_id, producer_id, producer_epoch)
        if error == ErrorCode.none:
            unknown = [tp for tp in wanted if self._logs.get(*tp) is None]
            if unknown:
                return {
                    tp: ErrorCode.unknown_topic_or_partition
                    if tp in unknown
                    else ErrorCode.operation_not_attempted
                    for tp in wanted
                }
        if error != ErrorCode.none:
            return dict.fromkeys(wanted, error)
        metadata = self.transactions[transactional_id]
        if metadata.state == TxnState.ONGOING and metadata.partitions.issuperset(wanted):
            return dict.fromkeys(wanted, ErrorCode.none)  # nothing new: no write
        self._begin(metadata, now_ms)
        metadata.partitions.update(wanted)
        self._write(metadata, now_ms)
        return dict.fromkeys(wanted, ErrorCode.none)

    def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str, now_ms: int
    ) -> ErrorCode:
        error = self._check_session(transactional_id, producer_id, producer_epoch)
        if error != ErrorCode.none:
            return error
        metadata = self.transactions[transactional_id]
        if metadata.state == TxnState.ONGOING and group_id in metadata.groups:
            return ErrorCode.none
        self._begin(metadata, now_ms)
        metadata.groups.add(group_id)
        self._write(metadata, now_ms)
        return ErrorCode.none

    @staticmethod
    def _begin(metadata: TransactionMetadata, now_ms: int) -> None:
        if metadata.state != TxnState.ONGOING:
            metadata.state = TxnState.ONGOING
            metadata.partitions.clear()
            metadata.groups.clear()
            metadata.start_ms = now_ms

    def end_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> tuple[ErrorCode, bool]:
        """(error, whether markers must now be written). A retry of a completed EndTxn is OK."""
        metadata = self.transactions.get(transactional_id)
        if metadata is None or metadata.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, False
        if metadata.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced, False
        wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if metadata.state == wanted_complete:
            return ErrorCode.none, False
        if metadata.state.is_prepared:
            return ErrorCode.concurrent_transactions, False
        if metadata.state != TxnState.ONGOING:
            return ErrorCode.invalid_txn_state, False
        metadata.state = wanted_prepare
        self._write(metadata, now_ms)
        return ErrorCode.none, True

    def complete(self, transactional_id: str, now_ms: int) -> None:
        """Record that every marker of the prepared transaction is durable."""
        metadata = self.transactions[transactional_id]
        assert metadata.state.is_prepared, metadata.state
        metadata.state = (
            TxnState.COMPLETE_COMMIT if metadata.state == TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
        )
        metadata.partitions.clear()
        metadata.groups.clear()
        metadata.start_ms = -1
        self._write(metadata, now_ms)

    def pending_completions(self) -> list[str]:
        """Prepared transactions whose markers may not all be written (after a restart)."""
        return [tid for tid, metadata in self.transactions.items() if metadata.state.is_prepared]

    # -- timeouts and expiry ------------------------------------------------------------------

    def abort_timed_out(self, now_ms: int) -> list[str]:
        """Fence and abort every Ongoing transaction older than its timeout; returns their ids."""
        timed_out = [
            metadata
            for metadata in self.transactions.values()
            if metadata.state == TxnState.ONGOING and now_ms - metadata.start_ms > metadata.timeout_ms
        ]
        for metadata in timed_out:
            self._fence_and_abort(metadata, now_ms)
        return [metadata.transactional_id for metadata in timed_out]

    def abort(self, transactional_id: str, now_ms: int) -> bool:
        """An operator's abort of an open transaction (fencing its producer); False if none is open."""
        metadata = self.transactions.get(transactional_id)
        if metadata is None or metadata.state != TxnState.ONGOING:
            return False
        self._fence_and_abort(metadata, now_ms)
        return True

    def expire_idle_ids(self, now_ms: int) -> int:
        """transactional.id.expiration.ms: forget ids idle that long with no open transaction."""
        idle = [
            tid
            for tid, metadata in self.transactions.items()
            if metadata.state.is_complete and now_ms - metadata.update_ms > self.id_expiration_ms
        ]
        for tid in idle:
            self._append(tid, None, now_ms)
            self._forget(tid)
        return len(idle)

    # -- questions from other parts of the broker ---------------------------------------------

    def check_transactional_produce(
        self, producer_id: int, producer_epoch: int, partition: TopicPartition
    ) -> ErrorCode:
        """Whether a transactional batch may be appended to `partition` (zombies may not)."""
        metadata = self._by_producer_id.get(producer_id)
        if metadata is None:
            return ErrorCode.invalid_txn_state
        if producer_epoch < metadata.producer_epoch:
            return ErrorCode.invalid_producer_epoch
        if metadata.state != TxnState.ONGOING or partition not in metadata.partitions:
            return ErrorCode.invalid_txn_state
        return ErrorCode.none

    def check_offset_commit(self, producer_id: int, producer_epoch: int, group_id: str) -> ErrorCode:
        """Whether TxnOffsetCommit may stage offsets for `group_id` in this producer's transaction."""
        metadata = self._by_producer_id.get(producer_id)
        if metadata is None:
            return ErrorCode.invalid_producer_id_mapping
        if producer_epoch != metadata.producer_epoch:
            return ErrorCode.producer_fenced
        if metadata.state != TxnState.ONGOING or group_id not in metadata.groups:
            return ErrorCode.invalid_txn_state
        return ErrorCode.none
