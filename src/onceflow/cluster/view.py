"""What a broker knows of its cluster: one consistent read of the znodes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from onceflow.cluster.znodes import NO_LEADER, BrokerRegistration, PartitionState, TopicAssignment


@dataclass(frozen=True)
class ClusterView:
    brokers: Mapping[int, BrokerRegistration] = field(default_factory=dict)
    controller_id: int = NO_LEADER
    controller_epoch: int = 0
    topics: Mapping[str, TopicAssignment] = field(default_factory=dict)
    states: Mapping[tuple[str, int], PartitionState] = field(default_factory=dict)
    topic_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Znode versions of the states, for compare-and-set writes.
    state_versions: Mapping[tuple[str, int], int] = field(default_factory=dict)
    # Topics marked for deletion (DeleteTopics) that the controller has not deleted yet.
    topics_to_delete: frozenset[str] = frozenset()

    def leader(self, topic: str, partition: int) -> int:
        state = self.states.get((topic, partition))
        return NO_LEADER if state is None else state.leader

    def live_leader(self, topic: str, partition: int) -> int:
        """The leader as clients are told of it: none while the broker named is not live (it
        died and the controller has not elected another yet), as Kafka's metadata cache answers.
        A client told of a leader missing from the brokers it was given may never recover: a
        kafka-python producer failed on every round of its I/O thread."""
        leader = self.leader(topic, partition)
        return leader if leader in self.brokers else NO_LEADER

    def isr(self, topic: str, partition: int) -> tuple[int, ...]:
        state = self.states.get((topic, partition))
        return () if state is None else state.isr

    @cached_property
    def names_by_topic_id(self) -> Mapping[uuid.UUID, str]:
        return {topic.topic_id: name for name, topic in self.topics.items()}

    @property
    def coordinator_id(self) -> int:
        """The broker that hosts the coordinators' internal topics: the live broker with the lowest
        id (simple and the same on every broker; the topics are not replicated yet)."""
        return min(self.brokers, default=NO_LEADER)
