"""Write, then apply, in the group coordinator: when the `__consumer_offsets` append fails at
any operation that writes, nothing durable changes, the client gets NOT_COORDINATOR, and the
coordinator agrees with a fresh one replayed from the log. (Membership between rebalances is
not logged, as in Kafka; what is compared is what the log holds: offsets, staged offsets,
and the members and assignments of Stable groups.)"""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import (
    GroupState,
    JoinResult,
    OffsetAndMetadata,
    Protocol,
    SyncResult,
    TopicPartition,
)
from onceflow.coordinator.group_requests import GroupConfig, JoinRequest, SyncRequest
from onceflow.log.errors import LogAppendError
from tests.memory_coordinator_log import DISK_FULL, MemoryLog

PARTITION = TopicPartition("t", 0)
PRODUCER = 7


class Harness:
    def __init__(self) -> None:
        self.log = MemoryLog()
        self.coordinator = self.replayed()

    def replayed(self) -> GroupCoordinator:
        return GroupCoordinator(
            self.log, {PARTITION}.__contains__, GroupConfig(initial_rebalance_delay_ms=0), 0
        )

    def join(self, group: str, instance_id: str | None = None, member_id: str = "") -> JoinResult:
        answers: list[JoinResult] = []
        request = JoinRequest(
            group, member_id, instance_id, "client", "host", 10_000, 10_000, "consumer",
            (Protocol("range", b"s"),), require_known_member_id=False,
        )  # fmt: skip
        self.coordinator.join_group(request, 0, answers.append)
        assert len(answers) == 1
        return answers[0]

    def sync(self, group: str, joined: JoinResult, instance_id: str | None = None) -> SyncResult:
        answers: list[SyncResult] = []
        assignments = {joined.member_id: b"assigned"}
        request = SyncRequest(
            group, joined.generation_id, joined.member_id, instance_id, None, None, assignments
        )
        self.coordinator.sync_group(request, 0, answers.append)
        assert len(answers) == 1
        return answers[0]

    def stable_group(self, group: str, instance_id: str | None = None) -> JoinResult:
        joined = self.join(group, instance_id)
        assert self.sync(group, joined, instance_id).error == ErrorCode.none
        return joined


def _durable_view(coordinator: GroupCoordinator) -> dict[str, Any]:
    """What the log holds, as the coordinator reports it."""
    view: dict[str, Any] = {}
    for listing in coordinator.list_groups():
        group = listing.group_id
        described = coordinator.describe_group(group)
        assert described is not None
        stable = described if described.state is GroupState.STABLE else None
        offsets = coordinator.fetch_offsets(group, None, require_stable=False)
        if offsets or stable is not None or coordinator.has_pending_offsets(group, *PARTITION):
            view[group] = (offsets, stable)
    view["staged"] = coordinator.staged_offsets(PRODUCER)
    return view


def _commit(h: Harness) -> list[ErrorCode]:
    return list(
        h.coordinator.commit_offsets("g", -1, "", None, {PARTITION: OffsetAndMetadata(5)}, 1).values()
    )


def _commit_as_member(h: Harness) -> list[ErrorCode]:
    joined = h.stable_group("g")
    offsets = {PARTITION: OffsetAndMetadata(5)}
    return list(
        h.coordinator.commit_offsets("g", joined.generation_id, joined.member_id, None, offsets, 1).values()
    )


def _txn_commit(h: Harness) -> list[ErrorCode]:
    offsets = {PARTITION: OffsetAndMetadata(9)}
    return list(
        h.coordinator.commit_transactional_offsets("g", PRODUCER, 0, -1, "", None, offsets, 1).values()
    )


def _delete(h: Harness) -> list[ErrorCode]:
    _commit(h)
    return list(h.coordinator.delete_groups(["g"], 2).values())


def _leader_sync(h: Harness) -> list[ErrorCode]:
    joined = h.join("g")
    return [h.sync("g", joined).error]


def _static_member_restart(h: Harness) -> list[ErrorCode]:
    h.stable_group("g", "static")
    return [h.join("g", "static").error]  # a new incarnation of the same instance


OPERATIONS = {
    "OffsetCommit": _commit,
    "OffsetCommit by a member": _commit_as_member,
    "TxnOffsetCommit": _txn_commit,
    "DeleteGroups": _delete,
    "SyncGroup from the leader": _leader_sync,
    "JoinGroup of a restarted static member": _static_member_restart,
}


# A full disk, and a partition whose ISR is below min.insync.replicas (its leader refuses the
# append before writing anything), with the code each is answered, as Kafka's group coordinator.
FAILURES = {
    "disk full": (DISK_FULL, ErrorCode.not_coordinator),
    "too few in sync": (
        LogAppendError(ErrorCode.not_enough_replicas, "ISR below min.insync.replicas"),
        ErrorCode.coordinator_not_available,
    ),
}


@pytest.mark.parametrize(("failure", "answered"), FAILURES.values(), ids=FAILURES.keys())
@pytest.mark.parametrize("operation", OPERATIONS.values(), ids=OPERATIONS.keys())
def test_a_failed_append_changes_nothing_durable(
    operation: Any, failure: LogAppendError, answered: ErrorCode
) -> None:
    # A trial run counts the appends of the operation's setup; the real run fails the next.
    trial = Harness()
    operation(trial)
    setup_appends = len(trial.log.records) - 1

    harness = Harness()
    original_append = harness.log.append
    before: list[dict[str, Any]] = []

    def append(records: Any, now_ms: int) -> int:
        if len(harness.log.records) < setup_appends:
            return original_append(records, now_ms)
        before.append(_durable_view(harness.coordinator))
        raise failure

    harness.log.append = append  # type: ignore[method-assign]
    codes = operation(harness)
    assert len(before) == 1, "the operation's own append was not reached"
    assert codes and all(code == answered for code in codes), codes
    assert _durable_view(harness.coordinator) == before[0], "memory ran ahead of the log"
    assert _durable_view(harness.replayed()) == before[0]


def test_a_failed_sync_leaves_the_group_rebalancing_and_a_retry_stabilises_it() -> None:
    harness = Harness()
    joined = harness.join("g")
    harness.log.failure = DISK_FULL
    assert harness.sync("g", joined).error == ErrorCode.not_coordinator
    described = harness.coordinator.describe_group("g")
    assert described is not None and described.state is GroupState.PREPARING_REBALANCE
    harness.log.failure = None
    rejoined = harness.join("g", member_id=joined.member_id)
    assert harness.sync("g", rejoined).error == ErrorCode.none
    assert _durable_view(harness.coordinator) == _durable_view(harness.replayed())


def test_a_failed_restart_of_a_static_member_keeps_the_old_incarnation() -> None:
    harness = Harness()
    first = harness.stable_group("g", "static")
    harness.log.failure = DISK_FULL
    assert harness.join("g", "static").error == ErrorCode.not_coordinator
    described = harness.coordinator.describe_group("g")
    assert described is not None and [m.member_id for m in described.members] == [first.member_id]
    harness.log.failure = None
    second = harness.join("g", "static")
    assert second.error == ErrorCode.none and second.member_id != first.member_id
    assert _durable_view(harness.coordinator) == _durable_view(harness.replayed())


def test_a_failed_transaction_outcome_changes_nothing() -> None:
    harness = Harness()
    _txn_commit(harness)
    before = _durable_view(harness.coordinator)
    harness.log.failure = DISK_FULL
    with pytest.raises(LogAppendError):
        harness.coordinator.complete_transaction(PRODUCER, 0, commit=True, coordinator_epoch=0, now_ms=3)
    assert _durable_view(harness.coordinator) == before == _durable_view(harness.replayed())
    harness.log.failure = None
    assert harness.coordinator.complete_transaction(
        PRODUCER, 0, commit=True, coordinator_epoch=0, now_ms=4
    ) == [harness.log]
    assert _durable_view(harness.coordinator) == _durable_view(harness.replayed())
    assert harness.coordinator.fetch_offsets("g", [PARTITION], True)[0].offset == OffsetAndMetadata(9)
