"""What `onceflow cluster status` reports, from one read of the znodes: the live brokers, the
controller, and the partitions that need an operator's eye (Kafka's under-replicated and offline
partitions, as `kafka-topics --describe --under-replicated-partitions` shows them)."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.cluster.view import ClusterView
from onceflow.cluster.znodes import NO_LEADER


@dataclass(frozen=True)
class PartitionHealth:
    topic: str
    partition: int
    leader: int  # NO_LEADER when offline
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class ClusterStatus:
    brokers: tuple[tuple[int, str, int], ...]  # (id, host, port), by id
    controller_id: int
    controller_epoch: int
    under_replicated: tuple[PartitionHealth, ...]
    offline: tuple[PartitionHealth, ...]


def cluster_status(view: ClusterView) -> ClusterStatus:
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
    return ClusterStatus(brokers, controller, view.controller_epoch, tuple(under_replicated), tuple(offline))
