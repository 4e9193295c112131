"""The transaction coordinator: a state machine replayed from its own log.

One coordinator per partition of `__transaction_state` (`runtime`), with the transactional ids
that `internal_topics` puts there. Write, then apply: every transition is a record appended to the
partition first and applied to memory only once the append succeeded, so a failed append (a full
disk, a lost leadership, too few replicas in sync) changes nothing and the client gets
NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE and retries. The broker answers once the record is
committed (fsynced and, in a cluster, copied by the partition's ISR). Loading replays the
partition: the last record of a transactional id is its state.

Phase two (`complete`) belongs here too: Prepare* committed, a marker on every partition and the
group's offsets settled, committed, then Complete*. The coordinator does not wait itself: it
yields what must be committed before the next step and the broker does the waiting. A
transaction left in Prepare* (by a crash, or by the partition's last leader) is completed once
the partition is loaded (`pending_completions`).

States and transitions follow docs/design.md#transaction-states (Kafka's transaction
protocol v1). Fencing an open transaction (InitProducerId while Ongoing, or a timeout) bumps
the epoch and writes PrepareAbort with the new epoch directly; its markers then fence the old
session on every partition.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from onceflow import failpoints
from onceflow.coordinator.runtime import (
    CoordinatorLog,
    CoordinatorResult,
    CoordinatorRuntime,
    DurableLog,
    KeyValue,
    append_error,
    run,
)
from onceflow.internal_topics import TRANSACTION_LOG
from onceflow.log.errors import LogError

_log = logging.getLogger(__name__)

# Compacted, as in Kafka: each record is a transactional id's whole state (or its tombstone).
TRANSACTION_LOG_CONFIG = {"cleanup.policy": "compact"}
# An epoch is an int16; Kafka issues a new producer id before the epoch would reach the top.
MAX_EPOCH = 32766
FENCED_MAX_EPOCH = 32767  # a fence may take the last value: no session starts from it

T = TypeVar("T")

TopicPartition = tuple[str, int]
# What phase two waits for before its next step: a log to be durable or, in a cluster, a marker
# that a partition's leader is writing (an awaitable the broker made).
Awaited = DurableLog | Awaitable[None]


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


class TxnLogRecord(NamedTuple):
    """One record of `__transaction_state`: the new state of a transactional id, or its
    tombstone (None) when the id expired."""

    transactional_id: str
    metadata: TransactionMetadata | None


def _encode(record: TxnLogRecord) -> KeyValue:
    value = None if record.metadata is None else record.metadata.encode()
    return record.transactional_id.encode(), value


def _decode(key: bytes | None, value: bytes | None) -> TxnLogRecord:
    if key is None:
        raise ValueError("a transaction log record without a key")
    transactional_id = key.decode()
    return TxnLogRecord(
        transactional_id, None if value is None else TransactionMetadata.decode(transactional_id, value)
    )


@dataclass(frozen=True)
class InitResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True)
class TxnReply(Generic[T]):
    """An operation's reply and what the broker must do before giving it."""

    reply: T
    # Answer once everything appended to these so far is committed: the reply may rest on a
    # write that is not (a retry of a request whose first answer was lost, say).
    committed: tuple[DurableLog, ...] = ()
    # Prepared transactions whose phase two (`complete`) must start now.
    completions: tuple[str, ...] = ()
    # EndTxn answers only after phase two, so a producer's next transaction never meets
    # CONCURRENT_TRANSACTIONS from its own previous one.
    answer_after_completion: bool = False


class TransactionPartitions(Protocol):
    """The broker's side of transactions: the data partitions and the group coordinator."""

    def has_partition(self, partition: TopicPartition) -> bool: ...

    def write_marker(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> Awaited | None:
        """Write a COMMIT or ABORT marker; what to wait on, None when the partition is gone.
        Raises LogError when an append here fails."""
        ...

    def complete_offsets(
        self, groups: Iterable[str], producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> Sequence[Awaited]:
        """Make visible or drop the offsets the producer staged in these groups (at their group
        coordinators); what to wait on. Raises LogError when an append here fails."""
        ...


class TransactionCoordinator:
    def __init__(
        self,
        log: CoordinatorLog,
        partitions: TransactionPartitions,
        allocate_producer_id: Callable[[], int],
        max_timeout_ms: int,
        id_expiration_ms: int,
        replay: bool = True,
    ) -> None:
        """The coordinator of `log`, replayed now unless `replay` is False: then the caller runs
        `load()` before anything else."""
        self._partitions = partitions
        self._allocate_producer_id = allocate_producer_id
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms
        # Changed only by `_apply`, from a record appended or replayed: never ahead of the log.
        self.transactions: dict[str, TransactionMetadata] = {}
        self._by_producer_id: dict[int, TransactionMetadata] = {}
        self._runtime = CoordinatorRuntime(log, _encode, _decode, self._apply)
        if replay:
            run(self.load())

    def load(self) -> Iterator[None]:
        """Replay the log, in steps (`CoordinatorRuntime.replay`)."""
        yield from self._runtime.replay()

    @property
    def log(self) -> DurableLog:
        return self._runtime.durable_log

    # -- the log ------------------------------------------------------------------------------

    def _apply(self, record: TxnLogRecord, offset: int) -> None:
        previous = self.transactions.pop(record.transactional_id, None)
        if previous is not None:
            self._by_producer_id.pop(previous.producer_id, None)
        if record.metadata is not None:
            self.transactions[record.transactional_id] = record.metadata
            self._by_producer_id[record.metadata.producer_id] = record.metadata

    def _run(
        self,
        result: CoordinatorResult[TxnLogRecord, T],
        failed: Callable[[ErrorCode], T],
        now_ms: int,
        completes: str | None = None,
        answer_after_completion: bool = False,
    ) -> TxnReply[T]:
        """Write `result`'s records, then apply them; on a failed append nothing changed and
        the reply is `failed(code)`."""
        try:
            self._runtime.write(result.records, now_ms)
        except LogError as failure:
            _log.warning("cannot append to %s: %s", TRANSACTION_LOG, failure)
            return TxnReply(failed(append_error(failure)))
        return TxnReply(
            result.reply,
            (self.log,),
            (completes,) if completes is not None else (),
            answer_after_completion,
        )

    @staticmethod
    def _transition(metadata: TransactionMetadata, now_ms: int, **changes: Any) -> TxnLogRecord:
        """The record of `metadata` with `changes`, for the runtime to append and then apply."""
        changes.setdefault("partitions", set(metadata.partitions))
        changes.setdefault("groups", set(metadata.groups))
        return TxnLogRecord(metadata.transactional_id, replace(metadata, update_ms=now_ms, **changes))

    # -- InitProducerId -----------------------------------------------------------------------

    def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int, now_ms: int
    ) -> TxnReply[InitResult]:
        """A new session; when one is open it is fenced and aborted (CONCURRENT_TRANSACTIONS:
        the client retries once the abort completes)."""
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return self._refuse(InitResult(ErrorCode.invalid_transaction_timeout))
        metadata = self.transactions.get(transactional_id)
        if metadata is None:
            created = TransactionMetadata(
                transactional_id, self._allocate_producer_id(), 0, timeout_ms, update_ms=now_ms
            )
            result = CoordinatorResult(
                [TxnLogRecord(transactional_id, created)], InitResult(ErrorCode.none, created.producer_id, 0)
            )
            return self._run(result, InitResult, now_ms)
        if metadata.state.is_prepared:
            return self._refuse(InitResult(ErrorCode.concurrent_transactions))
        if metadata.state == TxnState.ONGOING:
            # The old session may still be alive: fence it and abort what it left open.
            result = CoordinatorResult(
                [self._fence_and_abort(metadata, now_ms)], InitResult(ErrorCode.concurrent_transactions)
            )
            return self._run(result, InitResult, now_ms, completes=transactional_id)
        if producer_id >= 0:
            # KIP-360: the caller names its session. The one just replaced is a retry of a bump
            # whose answer was lost; anything but that or the current one is a fenced zombie.
            caller = (producer_id, producer_epoch)
            if caller == (metadata.last_producer_id, metadata.last_producer_epoch):
                return self._refuse(InitResult(ErrorCode.none, metadata.producer_id, metadata.producer_epoch))
            if caller != (metadata.producer_id, metadata.producer_epoch):
                return self._refuse(InitResult(ErrorCode.producer_fenced))
        new_id, new_epoch = self._next_epoch(metadata)
        record = self._transition(
            metadata,
            now_ms,
            producer_id=new_id,
            producer_epoch=new_epoch,
            last_producer_id=metadata.producer_id,
            last_producer_epoch=metadata.producer_epoch,
            timeout_ms=timeout_ms,
            state=TxnState.EMPTY,
            partitions=set(),
            groups=set(),
            start_ms=-1,
        )
        return self._run(
            CoordinatorResult([record], InitResult(ErrorCode.none, new_id, new_epoch)), InitResult, now_ms
        )

    def _refuse(self, reply: T) -> TxnReply[T]:
        """A reply that writes nothing; it still waits for the log, whose state it reports."""
        return TxnReply(reply, (self.log,))

    def _next_epoch(self, metadata: TransactionMetadata) -> tuple[int, int]:
        if metadata.producer_epoch >= MAX_EPOCH:
            return self._allocate_producer_id(), 0
        return metadata.producer_id, metadata.producer_epoch + 1

    def _fence_and_abort(self, metadata: TransactionMetadata, now_ms: int) -> TxnLogRecord:
        # The markers carry the bumped epoch, which fences the old one on every partition. The
        # bump is not a new session, so the last epoch keeps naming the one before it. It keeps
        # the producer id, even at MAX_EPOCH (Kafka's prepareFenceProducerEpoch goes to 32767):
        # markers for a new id would close no transaction on the partitions, and their LSO
        # would stay at the fenced transaction's first offset. The next session gets a new id.
        fenced_epoch = min(metadata.producer_epoch + 1, FENCED_MAX_EPOCH)
        return self._transition(metadata, now_ms, producer_epoch=fenced_epoch, state=TxnState.PREPARE_ABORT)

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
    ) -> TxnReply[dict[TopicPartition, ErrorCode]]:
        wanted = list(partitions)
        error = self._check_session(transactional_id, producer_id, producer_epoch)
        if error == ErrorCode.none:
            unknown = [tp for tp in wanted if not self._partitions.has_partition(tp)]
            if unknown:
                return self._refuse(
                    {
                        tp: ErrorCode.unknown_topic_or_partition
                        if tp in unknown
                        else ErrorCode.operation_not_attempted
                        for tp in wanted
                    }
                )
        if error != ErrorCode.none:
            return self._refuse(dict.fromkeys(wanted, error))
        metadata = self.transactions[transactional_id]
        if metadata.state == TxnState.ONGOING and metadata.partitions.issuperset(wanted):
            return self._refuse(dict.fromkeys(wanted, ErrorCode.none))  # nothing new: no write
        record = self._begin(metadata, now_ms, partitions=set(wanted))
        return self._run(
            CoordinatorResult([record], dict.fromkeys(wanted, ErrorCode.none)),
            lambda code: dict.fromkeys(wanted, code),
            now_ms,
        )

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """Whether each partition is in the producer's open transaction (AddPartitionsToTxn v4+
        with verify_only, as a partition leader asks under KIP-890): Kafka's answers, TRANSACTION_
        ABORTABLE for a partition that is not. It writes nothing."""
        wanted = list(partitions)
        metadata = self.transactions.get(transactional_id)
        error = self._check_session(transactional_id, producer_id, producer_epoch)
        if error != ErrorCode.none or metadata is None:
            return dict.fromkeys(wanted, error)
        ongoing = metadata.state == TxnState.ONGOING
        return {
            partition: ErrorCode.none
            if ongoing and partition in metadata.partitions
            else ErrorCode.transaction_abortable
            for partition in wanted
        }

    def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str, now_ms: int
    ) -> TxnReply[ErrorCode]:
        error = self._check_session(transactional_id, producer_id, producer_epoch)
        if error != ErrorCode.none:
            return self._refuse(error)
        metadata = self.transactions[transactional_id]
        if metadata.state == TxnState.ONGOING and group_id in metadata.groups:
            return self._refuse(ErrorCode.none)
        record = self._begin(metadata, now_ms, groups={group_id})
        return self._run(CoordinatorResult([record], ErrorCode.none), _same, now_ms)

    def _begin(
        self,
        metadata: TransactionMetadata,
        now_ms: int,
        partitions: set[TopicPartition] | None = None,
        groups: set[str] | None = None,
    ) -> TxnLogRecord:
        """Ongoing (starting a transaction if none is open), with more partitions or groups."""
        if metadata.state == TxnState.ONGOING:
            return self._transition(
                metadata,
                now_ms,
                partitions=metadata.partitions | (partitions or set()),
                groups=metadata.groups | (groups or set()),
            )
        return self._transition(
            metadata,
            now_ms,
            state=TxnState.ONGOING,
            partitions=partitions or set(),
            groups=groups or set(),
            start_ms=now_ms,
        )

    def end_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
    ) -> TxnReply[ErrorCode]:
        """EndTxn: Prepare*, then phase two. A retry of a completed EndTxn is OK."""
        metadata = self.transactions.get(transactional_id)
        if metadata is None or metadata.producer_id != producer_id:
            return self._refuse(ErrorCode.invalid_producer_id_mapping)
        if metadata.producer_epoch != producer_epoch:
            return self._refuse(ErrorCode.producer_fenced)
        wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if metadata.state == wanted_complete:
            return self._refuse(ErrorCode.none)
        if metadata.state.is_prepared:
            return self._refuse(ErrorCode.concurrent_transactions)
        if metadata.state != TxnState.ONGOING:
            return self._refuse(ErrorCode.invalid_txn_state)
        record = self._transition(metadata, now_ms, state=wanted_prepare)
        return self._run(
            CoordinatorResult([record], ErrorCode.none),
            _same,
            now_ms,
            completes=transactional_id,
            answer_after_completion=True,
        )

    # -- phase two ----------------------------------------------------------------------------

    def complete(self, transactional_id: str, now_ms: int) -> Iterator[tuple[Awaited, ...]]:
        """Phase two of a prepared transaction, as steps: after each `yield` the caller resumes
        once the logs yielded are committed and the markers yielded written. Prepare*
        committed, then a marker on every partition and the group offsets settled, all
        committed, then Complete*, committed. A crash anywhere leaves Prepare* in the log, and
        whoever loads the partition next finishes in the decided direction. Raises LogError when
        an append fails: the transaction stays prepared, and a later call starts over."""
        metadata = self.transactions[transactional_id]
        assert metadata.state.is_prepared, metadata.state
        commit = metadata.state == TxnState.PREPARE_COMMIT
        yield (self.log,)
        failpoints.reach("txn.after-prepare")
        failpoints.hold("txn.hold-after-prepare")  # a coordinator paused here, and its partition moved

        written: list[Awaited] = []
        for partition in sorted(metadata.partitions):
            marked = self._partitions.write_marker(
                partition, metadata.producer_id, metadata.producer_epoch, commit, now_ms
            )
            if marked is None:
                continue  # deleted meanwhile: nothing left to mark
            written.append(marked)
            if len(written) == 1 and failpoints.armed("txn.between-markers"):
                yield (marked,)  # so the crash really comes between a durable marker and the rest
                failpoints.reach("txn.between-markers")
        written += self._partitions.complete_offsets(
            sorted(metadata.groups), metadata.producer_id, metadata.producer_epoch, commit, now_ms
        )
        yield tuple(written)
        failpoints.reach("txn.before-complete")

        record = self._transition(
            metadata,
            now_ms,
            state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
            partitions=set(),
            groups=set(),
            start_ms=-1,
        )
        self._runtime.write([record], now_ms)
        yield (self.log,)

    def pending_completions(self) -> list[str]:
        """Prepared transactions whose markers may not all be written (after a restart)."""
        return [tid for tid, metadata in self.transactions.items() if metadata.state.is_prepared]

    # -- timeouts and expiry ------------------------------------------------------------------

    def abort_timed_out(self, now_ms: int) -> TxnReply[list[str]]:
        """Fence and abort every Ongoing transaction older than its timeout; replies with their
        ids. One that cannot be written stays Ongoing, for the next sweep."""
        timed_out = [
            metadata
            for metadata in self.transactions.values()
            if metadata.state == TxnState.ONGOING and now_ms - metadata.start_ms > metadata.timeout_ms
        ]
        aborted = []
        for metadata in timed_out:
            reply = self._run(
                CoordinatorResult([self._fence_and_abort(metadata, now_ms)], True), _not_aborted, now_ms
            )
            if reply.reply:
                aborted.append(metadata.transactional_id)
        return TxnReply(aborted, (self.log,), tuple(aborted))

    def expire_idle_ids(self, now_ms: int) -> int:
        """transactional.id.expiration.ms: forget ids idle that long with no open transaction.
        Returns how many were forgotten."""
        idle = [
            TxnLogRecord(tid, None)
            for tid, metadata in self.transactions.items()
            if metadata.state.is_complete and now_ms - metadata.update_ms > self.id_expiration_ms
        ]
        reply = self._run(CoordinatorResult(idle, len(idle)), lambda _: 0, now_ms)
        return reply.reply

    # -- questions from other parts of the broker ---------------------------------------------

    def check_transactional_produce(
        self, producer_id: int, producer_epoch: int, partition: TopicPartition
    ) -> ErrorCode:
        """Whether a transactional batch may be appended to `partition` (zombies may not)."""
        metadata = self._by_producer_id.get(producer_id)
        if metadata is None:
            return ErrorCode.invalid_txn_state
        if producer_epoch != metadata.producer_epoch:
            # A newer epoch than the coordinator's too (KIP-890's verification): taken, it would
            # fence the markers of the transaction's real epoch on this partition.
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


def _same(code: ErrorCode) -> ErrorCode:
    return code


def _not_aborted(_: ErrorCode) -> bool:
    return False
