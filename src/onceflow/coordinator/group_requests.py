"""What the group coordinator's callers pass in and get back: its configuration, the requests
it takes, and the offsets and descriptions it answers with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from onceflow.coordinator.group_metadata import GroupState, OffsetAndMetadata, Protocol, TopicPartition


@dataclass(frozen=True)
class GroupConfig:
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    offset_metadata_max_bytes: int = 4096

    @classmethod
    def from_kafka(cls, props: Mapping[str, str]) -> GroupConfig:
        """The `group.*` and `offset.metadata.max.bytes` broker keys; defaults for the rest."""
        keys = {
            "group.initial.rebalance.delay.ms": "initial_rebalance_delay_ms",
            "group.min.session.timeout.ms": "min_session_timeout_ms",
            "group.max.session.timeout.ms": "max_session_timeout_ms",
            "offset.metadata.max.bytes": "offset_metadata_max_bytes",
        }
        values = {}
        for key, name in keys.items():
            if key in props:
                try:
                    values[name] = int(props[key])
                except ValueError:
                    raise ValueError(f"{key} must be an integer, got {props[key]!r}") from None
        return cls(**values)


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    # JoinGroup v4+: a new member first gets MEMBER_ID_REQUIRED and the id to join with.
    require_known_member_id: bool


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: Mapping[str, bytes]  # from the leader; empty from followers


class MemberIdentity(NamedTuple):
    member_id: str
    group_instance_id: str | None


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    partition: TopicPartition
    offset: OffsetAndMetadata | None  # None: nothing committed
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class StagedOffset:
    group_id: str
    partition: TopicPartition
    offset: OffsetAndMetadata
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: GroupState
    protocol_type: str
    protocol_name: str
    members: tuple[MemberDescription, ...]


class GroupListing(NamedTuple):
    group_id: str
    protocol_type: str
    state: GroupState
