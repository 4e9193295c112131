"""The controller as a state machine: events in, partition-state writes out (no ZooKeeper here).

After Kafka's ZooKeeper-era `KafkaController` and `PartitionStateMachine`: the controller caches
every partition's state with its znode version and answers each event (it became controller, a
broker came or went, a topic was created) with the compare-and-set writes that bring the states
in line. It assumes each write succeeds; when one does not (someone else wrote first), the shell
builds a new machine from what ZooKeeper holds, as Kafka's controller re-reads on a version
conflict.

Election, as Kafka's `OfflinePartitionLeaderElectionStrategy`: the first replica, in assignment
order, that is live and in the ISR (clean); if none and unclean election is enabled for the topic,
the first live replica (unclean, which may lose acknowledged records); otherwise no leader (-1),
and the ISR keeps its last members so that one of them coming back is a clean leader again.
Every change of leader or ISR bumps the leader epoch.

Elections asked for (ElectLeaders, Kafka's `PreferredReplicaPartitionLeaderElectionStrategy` and
its unclean counterpart): a preferred election moves leadership to the first assigned replica if
it is live and in the ISR; an unclean one elects a leader for a partition that has none, from the
ISR if a member is live, else the first live replica.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from onceflow.cluster.znodes import NO_LEADER, PartitionState

CREATE = -1  # StateWrite.expected_version of a state znode that does not exist yet

Replicas = tuple[int, ...]


class ReplicationFactorError(ValueError):
    """More replicas asked for than there are live brokers (INVALID_REPLICATION_FACTOR)."""


def assign_replicas(
    topic: str, partitions: int, replication_factor: int, brokers: Collection[int]
) -> tuple[Replicas, ...]:
    """Round robin over the live brokers (Kafka's rack-unaware assignment): partition p's first
    replica is the broker after the previous partition's, the others follow it. The start
    depends on the topic's name, so the leaders of single-partition topics spread out too."""
    ordered = sorted(brokers)
    if replication_factor < 1:
        raise ReplicationFactorError(
            f"replication factor {replication_factor} must be at least 1 (or -1 for the default)"
        )
    if replication_factor > len(ordered):
        raise ReplicationFactorError(
            f"replication factor {replication_factor} needs that many live brokers, "
            f"and {len(ordered)} are live"
        )
    start = zlib.crc32(topic.encode())
    count = len(ordered)
    return tuple(
        tuple(ordered[(start + partition + shift) % count] for shift in range(replication_factor))
        for partition in range(partitions)
    )


def next_state(
    replicas: Sequence[int],
    current: PartitionState | None,
    live: Collection[int],
    unclean: bool,
    controller_epoch: int,
) -> PartitionState | None:
    """The partition's new state given the live brokers, or None when it stays as it is."""
    live_replicas = tuple(replica for replica in replicas if replica in live)
    if current is None:
        if live_replicas:
            return PartitionState(live_replicas[0], 0, live_replicas, controller_epoch)
        return PartitionState(NO_LEADER, 0, tuple(replicas), controller_epoch)
    isr = tuple(replica for replica in current.isr if replica in live)
    if current.leader in live:
        if isr == current.isr:
            return None
        leader, new_isr = current.leader, isr
    else:
        clean = [replica for replica in replicas if replica in isr]
        if clean:
            leader, new_isr = clean[0], isr
        elif unclean and live_replicas:
            leader, new_isr = live_replicas[0], (live_replicas[0],)
        else:
            # Offline: the ISR keeps its last members, the only clean leaders there can be.
            leader, new_isr = NO_LEADER, current.isr
    if leader == current.leader and new_isr == current.isr:
        return None
    return PartitionState(leader, current.leader_epoch + 1, new_isr, controller_epoch)


@dataclass(frozen=True)
class StateWrite:
    """Write `state` to the partition's state znode if its version is still `expected_version`."""

    topic: str
    partition: int
    state: PartitionState
    expected_version: int


class Election(enum.IntEnum):
    """ElectLeaders' election types."""

    PREFERRED = 0
    UNCLEAN = 1


class ElectionRefused(enum.Enum):
    """Why an asked-for election did not happen (Kafka's error for each)."""

    UNKNOWN_PARTITION = "unknown_topic_or_partition"
    NOT_NEEDED = "election_not_needed"
    PREFERRED_NOT_AVAILABLE = "preferred_leader_not_available"
    NO_ELIGIBLE_LEADER = "eligible_leaders_not_available"


def elected_state(
    replicas: Sequence[int], current: PartitionState, live: Collection[int], election: Election, epoch: int
) -> PartitionState | ElectionRefused:
    """The state an asked-for election writes, or why it does not happen."""
    leader_live = current.leader in live
    if election is Election.PREFERRED:
        preferred = replicas[0]
        if current.leader == preferred and leader_live:
            return ElectionRefused.NOT_NEEDED
        if preferred not in live or preferred not in current.isr:
            return ElectionRefused.PREFERRED_NOT_AVAILABLE
        return PartitionState(preferred, current.leader_epoch + 1, current.isr, epoch)
    if leader_live:
        return ElectionRefused.NOT_NEEDED
    clean = [replica for replica in replicas if replica in live and replica in current.isr]
    if clean:
        return PartitionState(clean[0], current.leader_epoch + 1, current.isr, epoch)
    live_replicas = [replica for replica in replicas if replica in live]
    if not live_replicas:
        return ElectionRefused.NO_ELIGIBLE_LEADER
    return PartitionState(live_replicas[0], current.leader_epoch + 1, (live_replicas[0],), epoch)


class ControllerStateMachine:
    def __init__(
        self,
        controller_epoch: int,
        live_brokers: Iterable[int],
        assignments: Mapping[str, Sequence[Replicas]],
        states: Mapping[tuple[str, int], tuple[PartitionState, int]],
        unclean: Callable[[str], bool],
    ) -> None:
        """`states` maps each partition that has a state znode to its state and znode version;
        `unclean` says whether a topic allows unclean leader election."""
        self.controller_epoch = controller_epoch
        self.live = set(live_brokers)
        self.assignments = {topic: tuple(replicas) for topic, replicas in assignments.items()}
        self.states = dict(states)
        self._unclean = unclean

    def became_controller(self) -> list[StateWrite]:
        """Everything the previous controller left undone: new partitions, dead leaders."""
        return self._reconcile(
            (topic, partition)
            for topic, replicas in self.assignments.items()
            for partition in range(len(replicas))
        )

    def broker_up(self, broker_id: int) -> list[StateWrite]:
        self.live.add(broker_id)
        return self._reconcile(self._hosted_by(broker_id))

    def broker_down(self, broker_id: int) -> list[StateWrite]:
        self.live.discard(broker_id)
        return self._reconcile(self._hosted_by(broker_id))

    def topic_created(self, topic: str, replicas: Sequence[Replicas]) -> list[StateWrite]:
        self.assignments[topic] = tuple(replicas)
        return self._reconcile((topic, partition) for partition in range(len(replicas)))

    def topic_deleted(self, topic: str) -> None:
        """Forget the topic, so that no state of its partitions is written again."""
        replicas = self.assignments.pop(topic, ())
        for partition in range(len(replicas)):
            self.states.pop((topic, partition), None)

    def elect(
        self, partitions: Iterable[tuple[str, int]] | None, election: Election
    ) -> tuple[list[StateWrite], dict[tuple[str, int], int | ElectionRefused]]:
        """ElectLeaders: the writes for `partitions` (every partition when None), and for each
        partition the leader it gets or why it gets none."""
        if partitions is None:
            partitions = [
                (topic, partition)
                for topic, replicas in sorted(self.assignments.items())
                for partition in range(len(replicas))
            ]
        writes: list[StateWrite] = []
        outcomes: dict[tuple[str, int], int | ElectionRefused] = {}
        for topic, partition in partitions:
            replicas = self.assignments.get(topic, ())
            cached = self.states.get((topic, partition))
            if not 0 <= partition < len(replicas) or cached is None:
                outcomes[topic, partition] = ElectionRefused.UNKNOWN_PARTITION
                continue
            current, version = cached
            state = elected_state(replicas[partition], current, self.live, election, self.controller_epoch)
            if isinstance(state, ElectionRefused):
                outcomes[topic, partition] = state
                continue
            writes.append(StateWrite(topic, partition, state, version))
            self.states[topic, partition] = (state, version + 1)
            outcomes[topic, partition] = state.leader
        return writes, outcomes

    def state_changed(self, topic: str, partition: int, state: PartitionState, version: int) -> None:
        """A state written by someone else (a leader changing its ISR): cache it."""
        self.states[topic, partition] = (state, version)

    def _hosted_by(self, broker_id: int) -> list[tuple[str, int]]:
        return [
            (topic, partition)
            for topic, replicas in self.assignments.items()
            for partition, nodes in enumerate(replicas)
            if broker_id in nodes
        ]

    def _reconcile(self, partitions: Iterable[tuple[str, int]]) -> list[StateWrite]:
        writes = []
        for topic, partition in partitions:
            cached = self.states.get((topic, partition))
            current, version = cached if cached is not None else (None, CREATE)
            state = next_state(
                self.assignments[topic][partition],
                current,
                self.live,
                self._unclean(topic),
                self.controller_epoch,
            )
            if state is None:
                continue
            writes.append(StateWrite(topic, partition, state, version))
            # ZooKeeper versions start at 0 and grow by one with every write.
            self.states[topic, partition] = (state, version + 1)
        return writes
