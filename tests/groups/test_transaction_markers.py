"""The markers that settle staged offsets on a partition of `__consumer_offsets`: refused from a
deposed transaction coordinator, and committing only what the transaction's own epoch staged."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import OffsetAndMetadata, TopicPartition
from onceflow.coordinator.group_requests import GroupConfig
from onceflow.log.errors import LogError
from tests.memory_coordinator_log import MemoryLog

TP = TopicPartition("t", 0)
PRODUCER = 9


def stage(coordinator: GroupCoordinator, offset: int, producer_epoch: int = 0) -> None:
    staged = coordinator.commit_transactional_offsets(
        "g", PRODUCER, producer_epoch, -1, "", None, {TP: OffsetAndMetadata(offset)}, 1
    )
    assert staged == {TP: ErrorCode.none}


def committed(coordinator: GroupCoordinator) -> int | None:
    [fetched] = coordinator.fetch_offsets("g", [TP], require_stable=False)
    return None if fetched.offset is None else fetched.offset.offset


def test_a_marker_from_an_older_transaction_coordinator_is_refused_also_after_a_reload() -> None:
    log = MemoryLog()
    coordinator = GroupCoordinator(log, lambda _: True, GroupConfig(), 0)
    stage(coordinator, 5)
    coordinator.complete_transaction(PRODUCER, 0, commit=True, coordinator_epoch=4, now_ms=2)
    stage(coordinator, 6)  # the producer's next transaction, open
    for live in (coordinator, GroupCoordinator(log, lambda _: True, GroupConfig(), 3)):
        with pytest.raises(LogError) as refused:  # a deposed coordinator's late commit
            live.complete_transaction(PRODUCER, 0, commit=True, coordinator_epoch=3, now_ms=4)
        assert refused.value.error_code == ErrorCode.transaction_coordinator_fenced
        assert committed(live) == 5 and live.has_pending_offsets("g", "t", 0)
    assert coordinator.complete_transaction(PRODUCER, 0, commit=False, coordinator_epoch=4, now_ms=5)
    assert committed(coordinator) == 5 and not coordinator.has_pending_offsets("g", "t", 0)


def test_a_commit_settles_only_what_the_transactions_epoch_staged() -> None:
    """A zombie of the fenced session (epoch 0) staged an offset after its fence; the new
    session's commit (epoch 1) must not make it the group's."""
    coordinator = GroupCoordinator(MemoryLog(), lambda _: True, GroupConfig(), 0)
    stage(coordinator, 50, producer_epoch=0)
    coordinator.complete_transaction(PRODUCER, 1, commit=True, coordinator_epoch=0, now_ms=2)
    assert committed(coordinator) is None
    stage(coordinator, 7, producer_epoch=1)
    coordinator.complete_transaction(PRODUCER, 1, commit=True, coordinator_epoch=0, now_ms=3)
    assert committed(coordinator) == 7
