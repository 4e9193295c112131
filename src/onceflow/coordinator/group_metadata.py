"""The in-memory model of one consumer group: members, generation, protocol, offsets.

Kafka's classic group (GroupMetadata/MemberMetadata) with the same rules: the first member
sets the protocol type and becomes leader, a joining member must share a protocol with every
member, and the selected protocol is the most preferred one among those all members support.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from kio.schema.errors import ErrorCode


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    # A group that does not exist (deleted, or never created) is described as Dead.
    DEAD = "Dead"


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Protocol(NamedTuple):
    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1


@dataclass(frozen=True, slots=True)
class StoredOffset:
    value: OffsetAndMetadata
    # Where the commit sits in the coordinator log: of two commits to one partition, the later
    # written wins, even when a transactional one becomes visible after a plain one.
    log_offset: int
    producer_epoch: int = -1  # of a transactional commit


class LeaderView(NamedTuple):
    """What the leader learns about each member to compute the assignment."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[LeaderView, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


JoinCallback = Callable[[JoinResult], None]
SyncCallback = Callable[[SyncResult], None]


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]  # in the member's order of preference
    assignment: bytes = b""
    # A JoinGroup or SyncGroup waiting for the rebalance to get further.
    join_callback: JoinCallback | None = None
    sync_callback: SyncCallback | None = None
    session_deadline_ms: int = 0
    # Joined but not yet through a completed rebalance: it cannot heartbeat yet.
    is_new: bool = False

    def metadata(self, protocol: str) -> bytes:
        return next(p.metadata for p in self.protocols if p.name == protocol)

    def matches(self, protocols: tuple[Protocol, ...]) -> bool:
        return self.protocols == protocols

    @property
    def waits_for_rebalance(self) -> bool:
        """A member waiting in JoinGroup or SyncGroup needs no heartbeat meanwhile."""
        return self.join_callback is not None or self.sync_callback is not None


@dataclass(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    # Member ids handed out with MEMBER_ID_REQUIRED, until their second JoinGroup or a timeout.
    pending_members: dict[str, int] = field(default_factory=dict)  # member id -> deadline
    # Members of the new generation that have not sent SyncGroup yet.
    pending_sync: set[str] = field(default_factory=set)
    join_deadline_ms: int | None = None
    sync_deadline_ms: int | None = None
    # The first rebalance of an empty group waits group.initial.rebalance.delay.ms, and again
    # while new members keep arriving, up to the rebalance timeout.
    initial_delay_remaining_ms: int | None = None
    new_member_added: bool = False
    offsets: dict[TopicPartition, StoredOffset] = field(default_factory=dict)
    pending_offsets: dict[int, dict[TopicPartition, StoredOffset]] = field(default_factory=dict)

    # -- membership ---------------------------------------------------------------------------

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if self.leader_id is None:
            self.leader_id = member.member_id
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member:
        member = self.members.pop(member_id)
        if member.group_instance_id is not None:
            self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_sync.discard(member_id)
        return member

    def validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        """UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID when the request is not from a current member."""
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return None

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.join_callback is not None for m in self.members.values())

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # -- protocols ----------------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, protocols: tuple[Protocol, ...]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        return any(
            all(any(p.name == name for p in m.protocols) for m in self.members.values())
            for name, _ in protocols
        )

    def select_protocol(self) -> str:
        return select_protocol([member.protocols for member in self.members.values()])

    def leader_view(self) -> tuple[LeaderView, ...]:
        assert self.protocol_name is not None
        return tuple(
            LeaderView(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    # -- offsets ------------------------------------------------------------------------------

    def subscribed_topics(self) -> frozenset[str]:
        """The topics the members of a `consumer` group subscribe to in the current protocol,
        from their subscriptions (Kafka's ConsumerProtocol); none before a first rebalance."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return frozenset()
        protocol = self.protocol_name
        return frozenset(
            topic
            for member in self.members.values()
            if any(p.name == protocol for p in member.protocols)
            for topic in subscription_topics(member.metadata(protocol))
        )

    def has_pending_offset(self, partition: TopicPartition) -> bool:
        return any(partition in staged for staged in self.pending_offsets.values())


CONSUMER_PROTOCOL_TYPE = "consumer"
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def subscription_topics(metadata: bytes) -> list[str]:
    """The topics of a ConsumerProtocol Subscription (every version starts with a version and
    the topic array); none when it cannot be read, as Kafka then knows of no subscription."""
    try:
        count = _INT32.unpack_from(metadata, 2)[0]
        position, topics = 6, []
        for _ in range(count):
            length = _INT16.unpack_from(metadata, position)[0]
            position += 2
            if length < 0 or position + length > len(metadata):
                return []
            topics.append(metadata[position : position + length].decode())
            position += length
    except (struct.error, UnicodeDecodeError):
        return []
    return topics


def select_protocol(member_protocols: Sequence[tuple[Protocol, ...]]) -> str:
    """Each member votes for its most preferred protocol among those every member supports."""
    candidates = [
        p.name
        for p in member_protocols[0]
        if all(p.name in _names(protocols) for protocols in member_protocols)
    ]
    votes = dict.fromkeys(candidates, 0)
    for protocols in member_protocols:
        votes[next(p.name for p in protocols if p.name in votes)] += 1
    return max(candidates, key=lambda name: votes[name])


def _names(protocols: tuple[Protocol, ...]) -> set[str]:
    return {p.name for p in protocols}
