"""What a broker knows of its cluster: one consistent read of the znodes.

The same view describes a single broker, as a cluster of one (`one_node_view`): it is the
controller, every partition's only replica and leader, at epoch 0. So the broker asks one set of
questions (who leads this partition, with what ISR, who coordinates this key, which brokers are
live) whether or not it runs in a cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from onceflow.cluster.znodes import NO_LEADER, BrokerRegistration, PartitionState, TopicAssignment
from onceflow.internal_topics import partition_for


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

    def partition_count(self, topic: str) -> int:
        """How many partitions the topic has; 0 when it does not exist."""
        assignment = self.topics.get(topic)
        return 0 if assignment is None else len(assignment.replicas)

    def has_partition(self, topic: str, partition: int) -> bool:
        return 0 <= partition < self.partition_count(topic)

    def coordinator(self, internal_topic: str, key: str) -> int:
        """The broker that coordinates `key`: the live leader of the partition of
        `internal_topic` that holds it (`internal_topics`), NO_LEADER while there is none (the topic
        is not created yet, or the partition has no live leader)."""
        partitions = self.partition_count(internal_topic)
        if not partitions:
            return NO_LEADER
        return self.live_leader(internal_topic, partition_for(key, partitions))

    @cached_property
    def names_by_topic_id(self) -> Mapping[uuid.UUID, str]:
        return {topic.topic_id: name for name, topic in self.topics.items()}


def one_node_view(
    broker: BrokerRegistration,
    topics: Mapping[str, tuple[uuid.UUID, int]],
    topic_configs: Mapping[str, Mapping[str, str]],
) -> ClusterView:
    """A single broker as a cluster of one: `topics` are its topics' ids and partition counts."""
    node = broker.broker_id
    only = PartitionState(node, 0, (node,), 0)
    return ClusterView(
        brokers={node: broker},
        controller_id=node,
        topics={
            name: TopicAssignment(topic_id, ((node,),) * count) for name, (topic_id, count) in topics.items()
        },
        states={(name, index): only for name, (_, count) in topics.items() for index in range(count)},
        topic_configs=topic_configs,
        state_versions={(name, index): 0 for name, (_, count) in topics.items() for index in range(count)},
    )
