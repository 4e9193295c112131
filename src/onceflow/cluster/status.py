"""What `onceflow cluster status` reports, from one read of the znodes: the live brokers, the
controller, the partitions that need an operator's eye (Kafka's under-replicated and offline
partitions, as `kafka-topics --describe --under-replicated-partitions` shows them), and where the
coordinators are: how many partitions of each internal topic every broker leads, and the broker
that coordinates each group or transactional id asked about."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from onceflow.cluster.view import ClusterView
from onceflow.cluster.znodes import NO_LEADER
from onceflow.internal_topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_LOG, partition_for


@dataclass(frozen=True)
class PartitionHealth:
    topic: str
    partition: int
    leader: int  # NO_LEADER when offline
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class CoordinatorTopic:
    """An internal topic: its partition count (0 before it is created) and how many of its
    partitions each live broker leads, that is, coordinates."""

    topic: str
    partitions: int
    led: tuple[tuple[int, int], ...]  # (broker id, partitions), by id


@dataclass(frozen=True)
class KeyCoordinator:
    """Who coordinates a group or a transactional id: the leader of its internal partition."""

    kind: str  # "group" or "transactional id"
    key: str
    topic: str
    partition: int  # -1 before the topic is created
    broker: int  # NO_LEADER while the partition has no live leader


@dataclass(frozen=True)
class ClusterStatus:
    brokers: tuple[tuple[int, str, int], ...]  # (id, host, port), by id
    controller_id: int
    controller_epoch: int
    under_replicated: tuple[PartitionHealth, ...]
    offline: tuple[PartitionHealth, ...]
    coordinators: tuple[CoordinatorTopic, ...] = ()
    keys: tuple[KeyCoordinator, ...] = ()


def cluster_status(
    view: ClusterView, groups: Iterable[str] = (), transactional_ids: Iterable[str] = ()
) -> ClusterStatus:
    """Offline: no live leader (none elected yet, or its broker is gone). Under-replicated: led,
    but with fewer replicas in sync than assigned."""
    under_replicated, offline = [], []
    for topic in sorted(view.topics):
        for partition, replicas in enumerate(view.topics[topic].replicas):
            state = view.states.get((topic, partition))
            leader = NO_LEADER if state is None or state.leader not in view.brokers else state.leader
            health = PartitionHealth(topic, partition, leader, replicas, () if state is None else state.isr)
            if leader == NO_LEADER:
                offline.append(health)
            elif len(health.isr) < len(replicas):
                under_replicated.append(health)
    live = sorted(view.brokers.items())
    brokers = tuple((broker.broker_id, broker.host, broker.port) for _, broker in live)
    controller = view.controller_id if view.controller_id in view.brokers else NO_LEADER
    coordinators = tuple(
        _coordinator_topic(view, topic) for topic in (CONSUMER_OFFSETS_TOPIC, TRANSACTION_LOG)
    )
    keys = [_key(view, "group", CONSUMER_OFFSETS_TOPIC, group) for group in groups]
    keys += [_key(view, "transactional id", TRANSACTION_LOG, tid) for tid in transactional_ids]
    return ClusterStatus(
        brokers,
        controller,
        view.controller_epoch,
        tuple(under_replicated),
        tuple(offline),
        coordinators,
        tuple(keys),
    )


def _coordinator_topic(view: ClusterView, topic: str) -> CoordinatorTopic:
    partitions = view.partition_count(topic)
    led = Counter(view.live_leader(topic, partition) for partition in range(partitions))
    return CoordinatorTopic(
        topic, partitions, tuple(sorted((b, n) for b, n in led.items() if b != NO_LEADER))
    )


def _key(view: ClusterView, kind: str, topic: str, key: str) -> KeyCoordinator:
    partitions = view.partition_count(topic)
    partition = partition_for(key, partitions) if partitions else -1
    return KeyCoordinator(kind, key, topic, partition, view.coordinator(topic, key))
