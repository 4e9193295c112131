"""The transaction coordinator as a state machine: error codes, KIP-360 rules, and replay."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kio.schema.errors import ErrorCode

from onceflow.coordinator.transaction import MAX_EPOCH, InitResult, TransactionCoordinator, TxnState
from tests.memory_coordinator_log import MemoryLog, MemoryPartitions, finish

TIMEOUT_MS = 60_000
MAX_TIMEOUT_MS = 900_000


class Harness:
    """The coordinator on a log in memory, with partitions data-0 and data-1."""

    def __init__(self) -> None:
        self.ids = itertools.count(1000)
        self.log = MemoryLog()
        self.partitions = MemoryPartitions([("data", 0), ("data", 1)])
        self.coordinator = self._coordinator()

    def _coordinator(self) -> TransactionCoordinator:
        return TransactionCoordinator(
            self.log, self.partitions, lambda: next(self.ids), MAX_TIMEOUT_MS, 7 * 86_400_000
        )

    def restart(self) -> None:
        """A new coordinator replays the log."""
        self.coordinator = self._coordinator()


@pytest.fixture
def harness() -> Harness:
    return Harness()


def _init(harness: Harness, tid: str = "t", pid: int = -1, epoch: int = -1, now: int = 0) -> InitResult:
    return harness.coordinator.init_producer_id(tid, TIMEOUT_MS, pid, epoch, now).reply


def _end(coordinator: TransactionCoordinator, *args: Any) -> tuple[ErrorCode, bool]:
    """EndTxn's error, and whether it started phase two."""
    reply = coordinator.end_transaction(*args)
    return reply.reply, reply.completions == (args[0],)


def test_a_new_id_gets_a_producer_id_at_epoch_zero_and_each_init_fences_the_last(harness: Harness) -> None:
    first = _init(harness)
    assert (first.error, first.producer_epoch) == (ErrorCode.none, 0)
    second = _init(harness)
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    assert harness.coordinator.add_partitions("t", first.producer_id, 0, [("data", 0)], 1).reply == {
        ("data", 0): ErrorCode.producer_fenced
    }


def test_timeouts_above_the_maximum_are_refused(harness: Harness) -> None:
    result = harness.coordinator.init_producer_id("t", MAX_TIMEOUT_MS + 1, -1, -1, 0).reply
    assert result.error == ErrorCode.invalid_transaction_timeout
    assert "t" not in harness.coordinator.transactions


def test_kip_360_retry_and_fencing(harness: Harness) -> None:
    session = _init(harness)
    bumped = _init(harness, pid=session.producer_id, epoch=0)
    assert bumped.producer_epoch == 1
    retry = _init(harness, pid=session.producer_id, epoch=0)  # the answer to the bump was lost
    assert (retry.error, retry.producer_epoch) == (ErrorCode.none, 1)
    stale = _init(harness, pid=session.producer_id, epoch=7)
    assert stale.error == ErrorCode.producer_fenced
    assert _init(harness, pid=session.producer_id + 99, epoch=1).error == ErrorCode.producer_fenced


def test_the_epoch_wraps_to_a_new_producer_id(harness: Harness) -> None:
    session = _init(harness)
    harness.coordinator.transactions["t"].producer_epoch = MAX_EPOCH
    renewed = _init(harness)
    assert (renewed.producer_epoch, renewed.producer_id != session.producer_id) == (0, True)


def test_add_partitions_errors(harness: Harness) -> None:
    session = _init(harness)
    pid = session.producer_id
    coordinator = harness.coordinator
    assert coordinator.add_partitions("unknown", pid, 0, [("data", 0)], 1).reply[("data", 0)] == (
        ErrorCode.invalid_producer_id_mapping
    )
    assert coordinator.add_partitions("t", pid + 1, 0, [("data", 0)], 1).reply[("data", 0)] == (
        ErrorCode.invalid_producer_id_mapping
    )
    assert coordinator.add_partitions("t", pid, 0, [("data", 0), ("nope", 0)], 1).reply == {
        ("data", 0): ErrorCode.operation_not_attempted,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
    }
    end = harness.log
    before = end.log_end_offset
    assert coordinator.add_partitions("t", pid, 0, [("data", 0)], 1).reply == {("data", 0): ErrorCode.none}
    assert end.log_end_offset == before + 1
    assert coordinator.add_partitions("t", pid, 0, [("data", 0)], 2).reply == {("data", 0): ErrorCode.none}
    assert end.log_end_offset == before + 1, "a partition already in the transaction needs no write"
    assert _end(coordinator, "t", pid, 0, True, 3) == (ErrorCode.none, True)
    assert (
        coordinator.add_partitions("t", pid, 0, [("data", 1)], 4).reply[("data", 1)]
        == ErrorCode.concurrent_transactions
    )


def test_end_transaction_rules(harness: Harness) -> None:
    pid = _init(harness).producer_id
    coordinator = harness.coordinator
    assert _end(coordinator, "t", pid, 0, True, 1) == (ErrorCode.invalid_txn_state, False)  # Empty
    coordinator.add_partitions("t", pid, 0, [("data", 0)], 1)
    assert _end(coordinator, "t", pid, 1, True, 2) == (ErrorCode.producer_fenced, False)
    assert _end(coordinator, "t", pid, 0, True, 2) == (ErrorCode.none, True)
    assert _end(coordinator, "t", pid, 0, True, 3) == (ErrorCode.concurrent_transactions, False)
    assert _init(harness).error == ErrorCode.concurrent_transactions
    finish(coordinator, "t", 4)
    assert _end(coordinator, "t", pid, 0, True, 5) == (ErrorCode.none, False)  # a retry
    assert _end(coordinator, "t", pid, 0, False, 5) == (ErrorCode.invalid_txn_state, False)


def test_init_during_an_open_transaction_fences_and_aborts_it(harness: Harness) -> None:
    pid = _init(harness).producer_id
    harness.coordinator.add_partitions("t", pid, 0, [("data", 0)], 1)
    reply = harness.coordinator.init_producer_id("t", TIMEOUT_MS, -1, -1, 0)
    assert (reply.reply.error, reply.completions) == (ErrorCode.concurrent_transactions, ("t",))
    metadata = harness.coordinator.transactions["t"]
    assert (metadata.state, metadata.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    finish(harness.coordinator, "t", 2)
    retried = _init(harness)
    assert (retried.error, retried.producer_epoch) == (ErrorCode.none, 2)


def test_timed_out_transactions_are_fenced_and_aborted(harness: Harness) -> None:
    pid = _init(harness).producer_id
    harness.coordinator.add_partitions("t", pid, 0, [("data", 0)], 1_000)
    assert harness.coordinator.abort_timed_out(1_000 + TIMEOUT_MS).reply == []
    assert harness.coordinator.abort_timed_out(1_001 + TIMEOUT_MS).reply == ["t"]
    assert harness.coordinator.transactions["t"].producer_epoch == 1
    assert (
        harness.coordinator.check_transactional_produce(pid, 0, ("data", 0))
        == ErrorCode.invalid_producer_epoch
    )


def test_the_zombie_check_for_produce(harness: Harness) -> None:
    pid = _init(harness).producer_id
    coordinator = harness.coordinator
    assert coordinator.check_transactional_produce(pid, 0, ("data", 0)) == ErrorCode.invalid_txn_state
    coordinator.add_partitions("t", pid, 0, [("data", 0)], 1)
    assert coordinator.check_transactional_produce(pid, 0, ("data", 0)) == ErrorCode.none
    assert coordinator.check_transactional_produce(pid, 0, ("data", 1)) == ErrorCode.invalid_txn_state
    assert coordinator.check_transactional_produce(pid + 5, 0, ("data", 0)) == ErrorCode.invalid_txn_state
    # A newer epoch than the coordinator's: taken, it would fence this transaction's own markers.
    assert coordinator.check_transactional_produce(pid, 5, ("data", 0)) == ErrorCode.invalid_producer_epoch


def test_a_fence_at_the_last_session_epoch_keeps_the_producer_id(harness: Harness) -> None:
    # The abort markers must carry the producer id whose transaction is open on the partitions,
    # or they close nothing there and the LSO stays where the transaction began.
    pid = _init(harness).producer_id
    harness.coordinator.transactions["t"].producer_epoch = MAX_EPOCH
    harness.coordinator.add_partitions("t", pid, MAX_EPOCH, [("data", 0)], 1)
    assert harness.coordinator.init_producer_id("t", TIMEOUT_MS, -1, -1, 2).reply.error == (
        ErrorCode.concurrent_transactions
    )
    fencing = harness.coordinator.transactions["t"]
    assert (fencing.state, fencing.producer_id, fencing.producer_epoch) == (
        TxnState.PREPARE_ABORT,
        pid,
        MAX_EPOCH + 1,
    )
    finish(harness.coordinator, "t", 3)
    renewed = _init(harness, now=4)
    assert (renewed.error, renewed.producer_epoch, renewed.producer_id != pid) == (ErrorCode.none, 0, True)


def test_idle_ids_expire(harness: Harness) -> None:
    _init(harness, now=0)
    harness.coordinator.id_expiration_ms = 1000
    assert harness.coordinator.expire_idle_ids(500) == 0
    assert harness.coordinator.expire_idle_ids(2000) == 1
    harness.restart()
    assert "t" not in harness.coordinator.transactions


def test_state_survives_a_restart_and_prepared_transactions_are_pending(harness: Harness) -> None:
    pid = _init(harness).producer_id
    harness.coordinator.add_partitions("t", pid, 0, [("data", 0), ("data", 1)], 1)
    harness.coordinator.add_offsets("t", pid, 0, "group", 1)
    harness.coordinator.end_transaction("t", pid, 0, True, 2)
    harness.restart()
    metadata = harness.coordinator.transactions["t"]
    assert metadata.state == TxnState.PREPARE_COMMIT
    assert metadata.partitions == {("data", 0), ("data", 1)} and metadata.groups == {"group"}
    assert harness.coordinator.pending_completions() == ["t"]


# Legal transitions of docs/design.md#transaction-states (PrepareEpochFence is folded into PrepareAbort).
LEGAL = {
    TxnState.ONGOING: {TxnState.EMPTY, TxnState.ONGOING, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT},
    TxnState.PREPARE_COMMIT: {TxnState.ONGOING},
    TxnState.PREPARE_ABORT: {TxnState.ONGOING},
    TxnState.COMPLETE_COMMIT: {TxnState.PREPARE_COMMIT},
    TxnState.COMPLETE_ABORT: {TxnState.PREPARE_ABORT},
    TxnState.EMPTY: {TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT},
}


class CoordinatorMachine(RuleBasedStateMachine):
    """Random clients against the coordinator: transitions stay legal, epochs only grow, and
    a replay of the log always rebuilds exactly the state in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.harness = Harness()
        self.now = 0
        self.sessions: dict[str, tuple[int, int]] = {}
        self.seen: dict[str, tuple[TxnState, int]] = {}

    def _tick(self) -> int:
        self.now += 10
        return self.now

    @rule(tid=st.sampled_from(["a", "b"]))
    def init(self, tid: str) -> None:
        result = self.harness.coordinator.init_producer_id(tid, TIMEOUT_MS, -1, -1, self._tick()).reply
        if result.error == ErrorCode.none:
            self.sessions[tid] = (result.producer_id, result.producer_epoch)

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), partitions=st.lists(st.sampled_from([("data", 0), ("data", 1)]), min_size=1))
    def add(self, data: st.DataObject, partitions: list[tuple[str, int]]) -> None:
        tid = data.draw(st.sampled_from(sorted(self.sessions)))
        pid, epoch = self.sessions[tid]
        self.harness.coordinator.add_partitions(tid, pid, epoch, partitions, self._tick())

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), commit=st.booleans())
    def end(self, data: st.DataObject, commit: bool) -> None:
        tid = data.draw(st.sampled_from(sorted(self.sessions)))
        pid, epoch = self.sessions[tid]
        self.harness.coordinator.end_transaction(tid, pid, epoch, commit, self._tick())

    @rule()
    def finish_markers(self) -> None:
        for tid in self.harness.coordinator.pending_completions():
            finish(self.harness.coordinator, tid, self._tick())

    @rule()
    def time_passes(self) -> None:
        self.now += TIMEOUT_MS
        self.harness.coordinator.abort_timed_out(self._tick())

    @rule()
    def crash_and_replay(self) -> None:
        before = {tid: m.encode() for tid, m in self.harness.coordinator.transactions.items()}
        self.harness.restart()
        assert {tid: m.encode() for tid, m in self.harness.coordinator.transactions.items()} == before

    @invariant()
    def transitions_are_legal_and_epochs_grow(self) -> None:
        for tid, metadata in self.harness.coordinator.transactions.items():
            previous = self.seen.get(tid)
            if previous is not None and previous != (metadata.state, metadata.producer_epoch):
                old_state, old_epoch = previous
                assert metadata.producer_epoch >= old_epoch or metadata.producer_epoch == 0
                if metadata.state != old_state:
                    assert old_state in LEGAL[metadata.state], (old_state, metadata.state)
            self.seen[tid] = (metadata.state, metadata.producer_epoch)


TestCoordinatorMachine = pytest.mark.soak(CoordinatorMachine.TestCase)  # a long randomized run
TestCoordinatorMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
