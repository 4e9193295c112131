"""A replica's state (`Partition`) without ZooKeeper: the high watermark, the ISR changes and the
KIP-497 window, on real logs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from onceflow.broker.core import Broker
from onceflow.broker.fetch_sessions import WantedPartition
from onceflow.broker.partition import Partition
from onceflow.cluster.controller import next_state
from onceflow.cluster.znodes import PartitionState
from onceflow.log.batch import validate_batches
from onceflow.log.log import PartitionLog
from tests.log.batches import make_batch
from tests.log.helpers import append, open_log

LEADER, FOLLOWER = 1, 2


class IsrOnlyPartition(Partition):
    """The high watermark as it was counted before KIP-497: by the ISR the metadata shows, not
    the ISR that a change in flight is making (the negative control)."""

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        return self.isr


def copy_to(follower: PartitionLog, leader: PartitionLog) -> None:
    """What a follower's fetch does: the leader's batches past the follower's end, as they are."""
    data = leader.read(follower.log_end_offset, 1 << 20)
    if data:
        follower.append(data, validate_batches(data), 0, replicated=True)


def write(log: PartitionLog, records: int = 1) -> None:
    append(log, make_batch(records))
    log.flush()


def leading(
    log: PartitionLog, kind: type[Partition] = Partition, isr: tuple[int, ...] = (LEADER,)
) -> Partition:
    partition = kind("t", 0, log, LEADER, stamps_epochs=True)
    partition.make_leader(1, (LEADER, FOLLOWER), isr, isr_version=5, now_ms=0)
    return partition


def acknowledged_while_joining(tmp_path: Path, kind: type[Partition]) -> tuple[int, int]:
    """A follower out of the ISR catches up and asks to join; the leader writes the new ISR to
    ZooKeeper, and before it reads it back acknowledges a record the follower has not fetched.
    Then the metadata shows the new ISR, the leader dies, and the controller elects the
    follower. Returns (what was acknowledged, what the new leader holds)."""
    leader_log, follower_log = open_log(tmp_path / "leader"), open_log(tmp_path / "follower")
    leader = leading(leader_log, kind)
    write(leader_log, 3)
    copy_to(follower_log, leader_log)
    _, joining = leader.follower_fetched(FOLLOWER, follower_log.log_end_offset, now_ms=10)
    assert joining == (LEADER, FOLLOWER)  # caught up to the high watermark: it may join
    change = leader.begin_isr_change(joining)
    assert change is not None
    leader.isr_change_written(change, True)  # in ZooKeeper; the leader's view still says (1,)
    write(leader_log)  # a record the follower has not fetched yet
    acknowledged = leader.high_watermark()  # acks=all producers below it have their answer
    leader.update_isr(joining, version=6)  # the metadata shows the new ISR
    assert leader.pending_isr is None
    elected = next_state((LEADER, FOLLOWER), PartitionState(LEADER, 1, joining, 1), {FOLLOWER}, False, 1)
    assert elected is not None and elected.leader == FOLLOWER  # a clean election: it is in the ISR
    return acknowledged, follower_log.log_end_offset


def test_kip_497_a_replica_joining_the_isr_counts_for_the_high_watermark(tmp_path: Path) -> None:
    acknowledged, new_leader_end = acknowledged_while_joining(tmp_path, Partition)
    assert acknowledged == 3
    assert new_leader_end >= acknowledged  # nothing acknowledged is lost


def test_kip_497_control_counted_by_the_shown_isr_an_acknowledged_record_is_lost(tmp_path: Path) -> None:
    acknowledged, new_leader_end = acknowledged_while_joining(tmp_path, IsrOnlyPartition)
    assert acknowledged == 4
    assert new_leader_end == acknowledged - 1  # the new leader lacks an acknowledged record


def test_a_shrink_in_flight_still_counts_the_leaving_replica(tmp_path: Path) -> None:
    leader_log = open_log(tmp_path / "leader")
    leader = leading(leader_log, isr=(LEADER, FOLLOWER))
    write(leader_log, 2)
    leader.follower_fetched(FOLLOWER, 2, now_ms=10)
    assert leader.high_watermark() == 2
    assert leader.begin_isr_change((LEADER,)) is not None
    write(leader_log)
    assert leader.high_watermark() == 2  # the follower may still be in the ISR
    assert leader.begin_isr_change((LEADER,)) is None  # one change at a time
    leader.update_isr((LEADER,), version=6)
    assert leader.high_watermark() == 3


def test_a_failed_isr_change_is_forgotten(tmp_path: Path) -> None:
    leader = leading(open_log(tmp_path / "leader"))
    change = leader.begin_isr_change((LEADER, FOLLOWER))
    assert change is not None and leader.maximal_isr == (LEADER, FOLLOWER)
    leader.isr_change_written(change, False)
    assert leader.pending_isr is None and leader.maximal_isr == (LEADER,)


def test_the_high_watermark_waits_for_every_isr_member_and_never_moves_back(tmp_path: Path) -> None:
    leader_log = open_log(tmp_path / "leader")
    leader = leading(leader_log, isr=(LEADER, FOLLOWER))
    write(leader_log, 4)
    assert leader.high_watermark() == 0  # the follower's end is unknown since the leadership began
    moved, joining = leader.follower_fetched(FOLLOWER, 3, now_ms=10)
    assert (moved, joining, leader.high_watermark()) == (True, None, 3)
    leader.follower_fetched(FOLLOWER, 1, now_ms=20)  # a follower that cut its log
    assert leader.high_watermark() == 3
    append(leader_log, make_batch())  # appended, not fsynced: the leader's fsync counts too
    leader.follower_fetched(FOLLOWER, 5, now_ms=30)
    assert leader.high_watermark() == 4


def test_a_single_replica_is_committed_once_fsynced(tmp_path: Path) -> None:
    log = open_log(tmp_path / "only")
    alone = Partition("t", 0, log, 0, stamps_epochs=False)
    assert alone.make_leader(0, (0,), (0,), isr_version=0, now_ms=0)
    append(log, make_batch(2))
    assert alone.high_watermark() == 0
    log.flush()
    assert alone.high_watermark() == 2
    assert alone.stamped_epoch is None  # a cluster of one keeps the clients' bytes


def test_a_follower_keeps_what_its_leader_said_and_a_new_epoch_forgets_the_followers(tmp_path: Path) -> None:
    log = open_log(tmp_path / "replica")
    replica = Partition("t", 0, log, FOLLOWER, stamps_epochs=True)
    replica.make_follower(LEADER, 3, (LEADER, FOLLOWER), (LEADER, FOLLOWER), isr_version=1)
    write(log, 5)
    replica.learned_high_watermark(4)
    assert replica.high_watermark() == 4
    assert replica.make_leader(4, (LEADER, FOLLOWER), (FOLLOWER, LEADER), isr_version=2, now_ms=0)
    assert replica.stamped_epoch == 4 and log.leader_epochs.latest_epoch == 4
    assert replica.high_watermark() == 4  # from what it knew as a follower, until LEADER fetches
    # An ISR change by the controller bumps the epoch but is no new leadership.
    assert not replica.make_leader(5, (LEADER, FOLLOWER), (FOLLOWER,), isr_version=3, now_ms=0)
    assert replica.lagging(lag_ms=100, now_ms=50) == []


def test_lagging_followers_are_those_not_caught_up_for_the_lag_time(tmp_path: Path) -> None:
    leader_log = open_log(tmp_path / "leader")
    leader = Partition("t", 0, leader_log, LEADER, stamps_epochs=True)
    leader.make_leader(1, (1, 2, 3, 4), (1, 2, 3, 4), isr_version=0, now_ms=1_000)
    write(leader_log, 10)
    leader.follower_fetched(2, 5, now_ms=2_000)  # behind
    leader.follower_fetched(3, 10, now_ms=2_000)  # caught up
    # Follower 2 last caught up when the leadership began; 4 never fetched at all.
    assert leader.lagging(lag_ms=500, now_ms=2_400) == [2, 4]
    assert leader.lagging(lag_ms=500, now_ms=1_400) == []


def test_a_session_partition_the_follower_has_all_of_is_skipped_only_while_nothing_moved(
    tmp_path: Path,
) -> None:
    # A session fetch's read of the partition (`Broker.recheck_quiet`, then
    # `Broker.follower_caught_up`) on a stand-in broker holding one partition led here.
    log = open_log(tmp_path / "leader")
    partition = leading(log, isr=(LEADER, FOLLOWER))
    write(log, 2)
    broker = SimpleNamespace(
        _partitions={("t", 0): partition}, logs=SimpleNamespace(get=lambda topic, index: log)
    )
    wanted = WantedPartition(0, fetch_offset=2, partition_max_bytes=100, current_leader_epoch=1)

    def skipped() -> bool:
        """As a fetch's read: a partition not skipped is read in full, the follower's offset noted."""
        if caught_up(broker, wanted) is log:
            return True
        partition.follower_fetched(FOLLOWER, wanted.fetch_offset, now_ms=0)
        return False

    assert not skipped()  # nothing answered for it yet
    wanted.sent = (0, 0, 0)
    assert partition.high_watermark() == 2  # the read above moved it: news
    assert not skipped()
    wanted.sent = (2, 2, 0)
    assert skipped()
    wanted.current_leader_epoch = 0
    assert not skipped()  # fenced: the full read answers the error
    wanted.current_leader_epoch = 1
    write(log)
    assert not skipped()  # records to copy
    wanted.fetch_offset = 3
    assert not skipped()  # where the follower fetches from now: the high watermark moves to 3
    assert not skipped()  # 3 is news
    wanted.sent = (3, 3, 0)
    assert skipped()
    assert partition.lagging(lag_ms=500, now_ms=10_000) == []  # a skipped fetch counts as caught up
    wanted.fetch_offset = 2
    assert not skipped()  # the follower cut its log back: records to copy again
    wanted.fetch_offset = 3
    assert not skipped()  # read in full once more, noting the follower at 3
    assert skipped()
    append(log, make_batch(1))
    assert not skipped()  # records to copy, before the leader's flush
    partition.make_follower(3, 2, (LEADER, FOLLOWER, 3), (3,), isr_version=6)
    assert not skipped()  # led elsewhere now


def test_a_skipped_partition_is_read_again_once_its_flush_another_follower_or_its_start_moves(
    tmp_path: Path,
) -> None:
    # The skip remembers what it depended on: each of these changes news for the follower
    # (the high watermark or the log start), and none of them is a fetch of this follower.
    third = 3
    log = open_log(tmp_path / "leader")
    partition = Partition("t", 0, log, LEADER, stamps_epochs=True)
    partition.make_leader(1, (LEADER, FOLLOWER, third), (LEADER, FOLLOWER, third), isr_version=5, now_ms=0)
    broker = SimpleNamespace(
        _partitions={("t", 0): partition},
        logs=SimpleNamespace(get=lambda topic, index: None if log.closed else log),
    )
    wanted = WantedPartition(0, fetch_offset=0, partition_max_bytes=100, current_leader_epoch=1)

    def skipped() -> bool:
        return caught_up(broker, wanted) is log

    def answered() -> None:
        """A full read: the follower's offset noted, the marks it was sent remembered."""
        partition.follower_fetched(FOLLOWER, wanted.fetch_offset, now_ms=0)
        hw = partition.high_watermark()
        wanted.sent = (hw, log.last_stable_offset(hw), log.log_start_offset)

    append(log, make_batch(2))
    partition.follower_fetched(third, 2, now_ms=0)
    wanted.fetch_offset = 2
    answered()
    assert wanted.sent == (0, 0, 0)  # not flushed yet
    assert skipped() and skipped()
    log.flush()
    assert not skipped()  # the high watermark moves to 2
    answered()
    assert skipped()
    write(log)
    wanted.fetch_offset = 3
    answered()
    assert wanted.sent == (2, 2, 0) and skipped()  # the third replica is still at 2
    partition.follower_fetched(third, 3, now_ms=0)
    assert not skipped()  # now at 3
    answered()
    assert skipped()
    log.delete_records_before(1)
    assert not skipped()  # the log start moved
    answered()
    assert skipped()
    wanted.sent = None
    assert not skipped()  # an error answered since: the marks go out again
    answered()
    assert skipped()
    log.close()
    assert not skipped()  # the topic is gone (its log closed, out of the broker's logs)


def caught_up(broker: SimpleNamespace, wanted: WantedPartition) -> object:
    """As a fetch's read of one session partition: the log of a partition found caught up."""
    Broker.recheck_quiet(cast(Broker, broker), FOLLOWER, [wanted], 10_000)
    if wanted.quiet is not None:
        return wanted.quiet.partition.log
    return Broker.follower_caught_up(cast(Broker, broker), "t", FOLLOWER, wanted, 10_000)


def test_waits_are_woken_only_when_the_high_watermark_moved(tmp_path: Path) -> None:
    log = open_log(tmp_path / "leader")
    partition = leading(log, isr=(LEADER, FOLLOWER))
    loop = asyncio.new_event_loop()
    try:
        waiter: asyncio.Future[float | None] = loop.create_future()
        partition.waiters.add(waiter)
        partition.wake_if_moved(1.0)
        assert waiter.done()  # the first look: nothing known of the waits yet
        waiter = loop.create_future()
        partition.waiters.add(waiter)
        write(log, 2)  # flushed, but the follower has not fetched it
        partition.wake_if_moved(2.0)
        assert not waiter.done()
        partition.follower_fetched(FOLLOWER, 2, now_ms=0)
        partition.wake_if_moved(3.0)
        assert waiter.result() == 3.0 and not partition.waiters
    finally:
        loop.close()


def test_a_new_leadership_wakes_its_waits_at_a_high_watermark_seen_before(tmp_path: Path) -> None:
    """Led, followed (its log cut, its high watermark lowered), led again: the high watermark
    returns to a value the waits were last woken at, and that is news to the waits made since."""
    log = open_log(tmp_path / "leader")
    partition = leading(log, isr=(LEADER, FOLLOWER))
    loop = asyncio.new_event_loop()
    try:
        write(log, 2)
        partition.follower_fetched(FOLLOWER, 2, now_ms=0)
        partition.wake_if_moved(1.0)  # woken at 2
        partition.make_follower(FOLLOWER, 2, (LEADER, FOLLOWER), (LEADER, FOLLOWER), isr_version=6)
        log.truncate_to(1, now_ms=0)
        partition.learned_high_watermark(1)
        partition.make_leader(3, (LEADER, FOLLOWER), (LEADER, FOLLOWER), isr_version=7, now_ms=0)
        waiter: asyncio.Future[float | None] = loop.create_future()
        partition.waiters.add(waiter)
        write(log)
        partition.follower_fetched(FOLLOWER, 1, now_ms=0)
        assert partition.high_watermark() == 1
        partition.follower_fetched(FOLLOWER, 2, now_ms=0)
        assert partition.high_watermark() == 2
        partition.wake_if_moved(2.0)
        assert waiter.done()
    finally:
        loop.close()
