"""Errors of cluster mode, importable without kazoo."""

from __future__ import annotations


class ClusterError(Exception):
    """Joining or following the cluster failed (ZooKeeper unreachable, a broker id taken)."""


class BrokerIdTakenError(ClusterError):
    """Another ZooKeeper session holds this broker id's registration."""


class TopicExistsError(Exception):
    """The topic's znode exists already (TOPIC_ALREADY_EXISTS)."""


class AssignmentChangedError(Exception):
    """The topic's znode changed, or went, between reading it and writing it."""


class PartitionCountError(Exception):
    """The topic has as many partitions as asked for, or more, already (INVALID_PARTITIONS)."""
