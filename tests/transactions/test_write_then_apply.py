"""Write, then apply: when the `__transaction_state` append fails at any operation, the
coordinator changes nothing, answers with Kafka's code for a failed coordinator write, and
its state is what a fresh coordinator replays from the log."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from onceflow.coordinator.transaction import TransactionCoordinator, TxnReply, TxnState
from onceflow.log.errors import LogAppendError
from tests.memory_coordinator_log import DISK_FULL, MemoryLog, MemoryPartitions, finish

TIMEOUT_MS = 60_000
DATA = ("data", 0)


class Harness:
    def __init__(self) -> None:
        self.ids = itertools.count(1000)
        self.log = MemoryLog()
        self.partitions = MemoryPartitions([DATA, ("data", 1)])
        self.coordinator = self.replayed()

    def replayed(self) -> TransactionCoordinator:
        """A fresh coordinator over the same log."""
        return TransactionCoordinator(self.log, self.partitions, lambda: next(self.ids), 900_000, 10_000)

    def session(self, tid: str = "t", now: int = 0) -> tuple[int, int]:
        reply = self.coordinator.init_producer_id(tid, TIMEOUT_MS, -1, -1, now).reply
        assert reply.error == ErrorCode.none
        return reply.producer_id, reply.producer_epoch

    def open_transaction(self, tid: str = "t", now: int = 0) -> tuple[int, int]:
        pid, epoch = self.session(tid, now)
        assert self.coordinator.add_partitions(tid, pid, epoch, [DATA], now).reply == {DATA: ErrorCode.none}
        return pid, epoch


def _state(coordinator: TransactionCoordinator) -> dict[str, bytes]:
    """Everything the coordinator knows, as its log records would say it."""
    state = {tid: metadata.encode() for tid, metadata in coordinator.transactions.items()}
    # The produce check's index must agree with the transactions.
    assert coordinator._by_producer_id == {m.producer_id: m for m in coordinator.transactions.values()}
    return state


def _init_new(h: Harness) -> TxnReply[Any]:
    return h.coordinator.init_producer_id("new", TIMEOUT_MS, -1, -1, 5)


def _init_bump(h: Harness) -> TxnReply[Any]:
    h.session()
    return h.coordinator.init_producer_id("t", TIMEOUT_MS, -1, -1, 5)


def _init_fencing_an_open_transaction(h: Harness) -> TxnReply[Any]:
    h.open_transaction()
    return h.coordinator.init_producer_id("t", TIMEOUT_MS, -1, -1, 5)


def _add_partitions(h: Harness) -> TxnReply[Any]:
    pid, epoch = h.open_transaction()
    return h.coordinator.add_partitions("t", pid, epoch, [("data", 1)], 5)


def _add_partitions_starting_a_transaction(h: Harness) -> TxnReply[Any]:
    pid, epoch = h.session()
    return h.coordinator.add_partitions("t", pid, epoch, [DATA], 5)


def _add_offsets(h: Harness) -> TxnReply[Any]:
    pid, epoch = h.open_transaction()
    return h.coordinator.add_offsets("t", pid, epoch, "group", 5)


def _end_commit(h: Harness) -> TxnReply[Any]:
    pid, epoch = h.open_transaction()
    return h.coordinator.end_transaction("t", pid, epoch, True, 5)


def _end_abort(h: Harness) -> TxnReply[Any]:
    pid, epoch = h.open_transaction()
    return h.coordinator.end_transaction("t", pid, epoch, False, 5)


def _abort_timed_out(h: Harness) -> TxnReply[Any]:
    h.open_transaction(now=0)
    return h.coordinator.abort_timed_out(TIMEOUT_MS + 1)


OPERATIONS: dict[str, Callable[[Harness], TxnReply[Any]]] = {
    "InitProducerId, new id": _init_new,
    "InitProducerId, epoch bump": _init_bump,
    "InitProducerId, fencing an open transaction": _init_fencing_an_open_transaction,
    "AddPartitionsToTxn": _add_partitions,
    "AddPartitionsToTxn, starting a transaction": _add_partitions_starting_a_transaction,
    "AddOffsetsToTxn": _add_offsets,
    "EndTxn commit": _end_commit,
    "EndTxn abort": _end_abort,
    "timeout abort": _abort_timed_out,
}


# A full disk, and a partition whose ISR is below min.insync.replicas (its leader refuses the
# append before writing anything, as an acks=all produce), with the code each is answered.
FAILURES = {
    "disk full": (DISK_FULL, ErrorCode.not_coordinator),
    "too few in sync": (
        LogAppendError(ErrorCode.not_enough_replicas, "ISR below min.insync.replicas"),
        ErrorCode.coordinator_not_available,
    ),
}


@pytest.mark.parametrize(("failure", "answered"), FAILURES.values(), ids=FAILURES.keys())
@pytest.mark.parametrize("operation", OPERATIONS.values(), ids=OPERATIONS.keys())
def test_a_failed_append_changes_nothing(
    operation: Callable[[Harness], TxnReply[Any]], failure: LogAppendError, answered: ErrorCode
) -> None:
    harness = Harness()
    result, before, log_end = _run_with_failing_last_append(harness, operation, failure)
    assert harness.log.log_end_offset == log_end
    assert _state(harness.coordinator) == before, "memory ran ahead of the log"
    assert _state(harness.replayed()) == before
    assert result.completions == (), "no phase two for a transition that was not written"
    codes = _codes(result.reply)
    assert codes and all(code in (answered, ErrorCode.not_coordinator) for code in codes), result.reply
    assert answered in codes or result.reply == [], result.reply


def _run_with_failing_last_append(
    harness: Harness, operation: Callable[[Harness], TxnReply[Any]], failure: LogAppendError = DISK_FULL
) -> tuple[TxnReply[Any], dict[str, bytes], int]:
    """Run `operation`, whose setup appends freely; its final call meets a full disk. The
    state before that call is taken at the moment the failing append is attempted, which
    comes before anything could be applied."""
    original_append = harness.log.append
    seen: list[tuple[dict[str, bytes], int]] = []
    setup_appends = _count_setup_appends(operation)

    def append(records: Any, now_ms: int) -> int:
        if len(seen) < setup_appends:
            seen.append(({}, 0))
            return original_append(records, now_ms)
        seen.append((_state(harness.coordinator), harness.log.log_end_offset))
        raise failure

    harness.log.append = append  # type: ignore[method-assign]
    result = operation(harness)
    before, log_end = seen[-1]
    return result, before, log_end


def _count_setup_appends(operation: Callable[[Harness], TxnReply[Any]]) -> int:
    """How many appends the operation makes with a working log, less its last one."""
    trial = Harness()
    operation(trial)
    return len(trial.log.records) - 1


def _codes(reply: Any) -> list[ErrorCode]:
    if isinstance(reply, ErrorCode):
        return [reply]
    if isinstance(reply, dict):
        return list(reply.values())
    if isinstance(reply, list):  # abort_timed_out: the ids it aborted
        return [ErrorCode.not_coordinator] if reply == [] else [ErrorCode.none]
    return [reply.error]


def test_after_a_failed_add_partitions_produce_is_refused_and_a_retry_succeeds() -> None:
    """The review's example: the partition must not count as part of the transaction."""
    harness = Harness()
    pid, epoch = harness.session()
    harness.log.failure = DISK_FULL
    reply = harness.coordinator.add_partitions("t", pid, epoch, [DATA], 1)
    assert reply.reply == {DATA: ErrorCode.not_coordinator}
    assert harness.coordinator.check_transactional_produce(pid, epoch, DATA) == ErrorCode.invalid_txn_state
    harness.log.failure = None
    assert harness.coordinator.add_partitions("t", pid, epoch, [DATA], 2).reply == {DATA: ErrorCode.none}
    assert harness.coordinator.check_transactional_produce(pid, epoch, DATA) == ErrorCode.none


def test_a_failed_complete_leaves_the_transaction_prepared_and_a_retry_finishes_it() -> None:
    harness = Harness()
    pid, epoch = harness.open_transaction()
    assert harness.coordinator.end_transaction("t", pid, epoch, True, 1).completions == ("t",)
    before = _state(harness.coordinator)
    harness.log.failure = DISK_FULL
    with pytest.raises(LogAppendError):
        finish(harness.coordinator, "t", 2)  # the markers are written; Complete* is not
    assert _state(harness.coordinator) == before == _state(harness.replayed())
    assert harness.coordinator.pending_completions() == ["t"]
    harness.log.failure = None
    finish(harness.coordinator, "t", 3)
    assert harness.coordinator.transactions["t"].state == TxnState.COMPLETE_COMMIT
    assert _state(harness.coordinator) == _state(harness.replayed())
    assert harness.partitions.markers == [(DATA, pid, epoch, True)] * 2  # once per attempt


def test_a_failed_marker_append_writes_no_complete() -> None:
    harness = Harness()
    pid, epoch = harness.open_transaction()
    harness.coordinator.end_transaction("t", pid, epoch, False, 1)
    harness.partitions.data.failure = DISK_FULL
    with pytest.raises(LogAppendError):
        finish(harness.coordinator, "t", 2)
    assert harness.coordinator.transactions["t"].state == TxnState.PREPARE_ABORT
    assert _state(harness.coordinator) == _state(harness.replayed())


def test_a_failed_expiry_forgets_nothing() -> None:
    harness = Harness()
    harness.session(now=0)
    before = _state(harness.coordinator)
    harness.log.failure = DISK_FULL
    assert harness.coordinator.expire_idle_ids(20_000) == 0
    assert _state(harness.coordinator) == before == _state(harness.replayed())
    harness.log.failure = None
    assert harness.coordinator.expire_idle_ids(20_000) == 1
    assert _state(harness.coordinator) == {} == _state(harness.replayed())
