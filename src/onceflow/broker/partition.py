"""One replica of a partition on this broker, after Kafka's `Partition`: its role and leader
epoch, the ISR with the change in flight, what a leader knows of its followers, the high
watermark, and the acks=all answers waiting on it.

It holds no ZooKeeper client and no socket: the broker tells it what the metadata says (its role,
the ISR) and what the followers fetch, and asks it for the high watermark, which is computed here
and nowhere else. A single broker's partitions are led by it alone, with itself as the ISR: the
high watermark is then the flushed offset.

KIP-497: while an ISR change this leader asked for is in flight (written to ZooKeeper, not yet
read back), the high watermark counts the maximal ISR, the current members and the joining
one (a shrink keeps counting the leaving ones until it is done). Counted by the current ISR
alone, a record could be acknowledged while the joining replica lacks it, and that replica, once
in the ISR, be elected and lose it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from onceflow.cluster.znodes import NO_LEADER
from onceflow.log.log import PartitionLog


@dataclass(frozen=True)
class PendingIsrChange:
    """An ISR change the leader wrote (or is writing) on top of the state znode version it read."""

    isr: tuple[int, ...]
    based_on_version: int


class Partition:
    def __init__(self, topic: str, index: int, log: PartitionLog, local_id: int, stamps_epochs: bool) -> None:
        """`stamps_epochs`: whether the leader stamps its epoch on the batches it appends (in a
        cluster; a one-node cluster's partitions never change leader, so they keep the clients'
        bytes as they came)."""
        self.topic = topic
        self.index = index
        self.log = log
        self.local_id = local_id
        self.stamps_epochs = stamps_epochs
        if stamps_epochs:
            log.adopt_replayed_epochs()
        self.leader_id = NO_LEADER
        self.leader_epoch = 0
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()  # as the metadata last said
        self.isr_version = -1  # the state znode version that said it
        self.pending_isr: PendingIsrChange | None = None
        self.epoch_start_offset = 0  # where this leader's epoch began in its log
        self.leader_since_ms = 0
        self._log_ends: dict[int, int] = {}  # each follower's, from the offset it fetches at
        self._caught_up_ms: dict[int, int] = {}
        # The last high watermark this broker knew: as a leader it never moves back, as a
        # follower it is what the leader last said (a cut lowers it).
        self._high_watermark = 0
        # acks=all answers (and coordinator writes) waiting for the high watermark to move.
        self.waiters: set[asyncio.Future[float | None]] = set()
        self._woken_at_high_watermark = -1  # by `wake_if_moved`
        # Counts the changes to all of the above but the waits: a leader's fetch sessions skip
        # a partition they found caught up while this (and its log's ends) stayed the same.
        self.version = 0

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.index

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_id

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR the high watermark counts: the current one, plus any replica joining it."""
        if self.pending_isr is None:
            return self.isr
        return self.isr + tuple(replica for replica in self.pending_isr.isr if replica not in self.isr)

    @property
    def stamped_epoch(self) -> int | None:
        """The epoch to stamp on batches appended here as leader, None to keep theirs."""
        return self.leader_epoch if self.stamps_epochs and self.is_leader else None

    # -- the role, as the metadata says ------------------------------------------------------
    def make_leader(
        self, epoch: int, replicas: tuple[int, ...], isr: tuple[int, ...], isr_version: int, now_ms: int
    ) -> bool:
        """Lead at `epoch`; whether this broker did not lead the partition before (a new epoch
        while it leads, which an ISR change by the controller makes, is no new leadership). A
        new epoch starts at the log end (the leader-epoch checkpoint), which is where followers
        holding more cut their logs, and what the leader knew of its followers is forgotten."""
        self.version += 1
        became_leader = not self.is_leader
        new_epoch = became_leader or epoch != self.leader_epoch
        self.replicas = replicas
        self.update_isr(isr, isr_version)
        if new_epoch:
            self.leader_id, self.leader_epoch = self.local_id, epoch
            self.leader_since_ms = now_ms
            self._log_ends.clear()
            self._caught_up_ms.clear()
            self.pending_isr = None
            # The high watermark may have gone down while another broker led (a follower's is
            # the leader's, and a cut lowers it): its next value is news to the waits.
            self._woken_at_high_watermark = -1
            if self.stamps_epochs:
                self.log.assign_leader_epoch(epoch)
                self.epoch_start_offset = self.log.epoch_start_offset(epoch)
        return became_leader

    def make_follower(
        self, leader_id: int, epoch: int, replicas: tuple[int, ...], isr: tuple[int, ...], isr_version: int
    ) -> None:
        """Follow `leader_id` (NO_LEADER: nobody leads it now)."""
        self.version += 1
        if self.is_leader:
            # Counted from the log end at most: a follower's high watermark is the leader's.
            self._high_watermark = min(self._high_watermark, self.log.log_end_offset)
        self.leader_id, self.leader_epoch, self.replicas = leader_id, epoch, replicas
        self.pending_isr = None
        self.update_isr(isr, isr_version)

    def update_isr(self, isr: tuple[int, ...], version: int) -> None:
        """The ISR as the metadata says it now. A change this leader wrote ends once the
        metadata shows a version at or past its write."""
        self.version += 1
        self.isr, self.isr_version = isr, version
        pending = self.pending_isr
        if pending is not None and (version > pending.based_on_version or isr == pending.isr):
            self.pending_isr = None

    # -- the leader's ISR changes ------------------------------------------------------------
    def begin_isr_change(self, isr: tuple[int, ...]) -> PendingIsrChange | None:
        """Start changing the ISR to `isr`, unless a change is in flight already."""
        if self.pending_isr is not None or not self.is_leader:
            return None
        self.version += 1
        self.pending_isr = PendingIsrChange(isr, self.isr_version)
        return self.pending_isr

    def isr_change_written(self, change: PendingIsrChange, written: bool) -> None:
        """The write of `change` ended. A failed one is forgotten (someone else wrote first: the
        next metadata says what); a written one stays maximal until the metadata shows it."""
        if self.pending_isr is change and not written:
            self.version += 1
            self.pending_isr = None

    def follower_fetched(
        self, replica_id: int, fetch_offset: int, now_ms: int
    ) -> tuple[bool, tuple[int, ...] | None]:
        """A follower fetched at `fetch_offset`, its log end now. Returns whether the high
        watermark moved, and the ISR to write if the follower may join it: caught up to the high
        watermark and into this leader's epoch (KAFKA-7128: a new leader's high watermark may lag
        what its predecessor acknowledged, and a replica below the epoch's start could be elected
        without those records)."""
        if not self.is_leader or replica_id not in self.replicas:
            return False, None
        self.version += 1
        moved = self._log_ends.get(replica_id) != fetch_offset
        before = self._high_watermark
        self._log_ends[replica_id] = fetch_offset
        if fetch_offset >= self.log.log_end_offset:
            self._caught_up_ms[replica_id] = now_ms
        high_watermark = self.high_watermark()
        joining = None
        if (
            replica_id not in self.isr
            and self.pending_isr is None
            and fetch_offset >= max(high_watermark, self.epoch_start_offset)
        ):
            self._caught_up_ms[replica_id] = now_ms  # not lagging the moment it is back
            joining = (*self.isr, replica_id)
        return moved and high_watermark > before, joining

    def unchanged_for(
        self, replica_id: int, fetch_offset: int, sent: tuple[int, int, int], now_ms: int
    ) -> bool:
        """Whether an ISR follower fetching at `fetch_offset`, this leader's log end and where it
        fetched last time, would learn nothing: the high watermark, last stable offset and log
        start are still those it was `sent`. It is counted as caught up, as `follower_fetched`
        would (which has nothing else to do then: its log end did not move, and it is in the ISR)."""
        partition_log = self.log
        if (
            not self.is_leader
            or fetch_offset != partition_log.log_end_offset
            or self._log_ends.get(replica_id) != fetch_offset
            or replica_id not in self.isr
        ):
            return False
        self._caught_up_ms[replica_id] = now_ms
        high_watermark = self.high_watermark()
        marks = (
            high_watermark,
            partition_log.last_stable_offset(high_watermark),
            partition_log.log_start_offset,
        )
        return marks == sent

    def caught_up(self, replica_id: int, now_ms: int) -> None:
        """An ISR follower fetched at the log end at `now_ms` (not lagging then)."""
        self._caught_up_ms[replica_id] = now_ms

    def lagging(self, lag_ms: int, now_ms: int) -> list[int]:
        """ISR members that have not caught up for `lag_ms` (Kafka's replica.lag.time.max.ms)."""
        return [
            replica
            for replica in self.isr
            if replica != self.local_id
            and now_ms - self._caught_up_ms.get(replica, self.leader_since_ms) > lag_ms
        ]

    # -- the high watermark ------------------------------------------------------------------
    def high_watermark(self) -> int:
        """What consumers may read: no further than the leader's flushed offset and, on a leader,
        than every member of the maximal ISR has; never moving back while it leads. A follower's
        is the leader's, as far as its own flushed copy goes."""
        flushed = self.log.flushed_offset
        if not self.is_leader:
            return min(self._high_watermark, flushed)
        lowest = flushed
        for replica in self.maximal_isr:
            if replica == self.local_id:
                continue
            end = self._log_ends.get(replica)
            if end is None:  # not heard from since this leadership began
                return min(self._high_watermark, flushed)
            lowest = min(lowest, end)
        if lowest > self._high_watermark:
            self._high_watermark = lowest
        return self._high_watermark

    def learned_high_watermark(self, high_watermark: int) -> None:
        """A follower's: what the leader said (or lower, after a cut)."""
        self.version += 1
        self._high_watermark = high_watermark

    @property
    def known_high_watermark(self) -> int:
        """The last high watermark this broker knew, where a new fetcher starts from."""
        return self._high_watermark

    # -- waits -------------------------------------------------------------------------------
    def wake_if_moved(self, woken_at: float) -> None:
        """Wake the waits if the high watermark moved since this last did: a flush or a
        follower's report that leaves it where it was ends none of them (each waits for it to
        pass an offset it had not reached, and a change of role wakes them with `wake`)."""
        high_watermark = self.high_watermark()
        if high_watermark != self._woken_at_high_watermark:
            self._woken_at_high_watermark = high_watermark
            self.wake(woken_at)

    def forget(self, woken_at: float) -> None:
        """This broker holds the partition no more (or holds another log for it)."""
        self.version += 1
        self.wake(woken_at)

    def wake(self, woken_at: float) -> None:
        """The high watermark may have moved, or the role changed: every wait looks again."""
        waiters, self.waiters = self.waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(woken_at)
