"""The records the group coordinator writes to `__consumer_offsets` and replays at start-up.

Each key and value is a format-version byte followed by JSON. The key says what the record
is about; replaying every record in log order rebuilds the coordinator's state:

    ["offset", group, topic, partition]                 a committed offset; null: deleted
                                                        (OffsetDelete, or its group deleted)
    ["txn_offset", group, producer id, topic, partition] an offset staged by a transaction;
                                                        null: deleted
    ["txn_end", producer id]                            {"commit": bool}: drop what that
                                                        producer staged, in every group; with
                                                        the epoch of the transaction
                                                        coordinator that sent the marker
    ["group", group]                                    the group after a rebalance; a null
                                                        value deletes the group and its offsets

The topic is compacted, so only the last record of each key is sure to survive, and the state
must follow from those alone. So a committed transaction writes its offsets again as "offset"
records next to its "txn_end" (with the log offset they were staged at, which decides between
commits), and deleting a group writes a tombstone for each of its offset keys. A "txn_end"
without `offsets_logged`, from before compaction, still applies what the producer staged.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from onceflow.coordinator.group_metadata import OffsetAndMetadata, TopicPartition

FORMAT_VERSION = 0


class RecordFormatError(ValueError):
    """A record this coordinator did not write, or wrote in a newer format."""


@dataclass(frozen=True, slots=True)
class OffsetCommitted:
    group_id: str
    partition: TopicPartition
    offset: OffsetAndMetadata


@dataclass(frozen=True, slots=True)
class OffsetCommittedInTransaction:
    """A staged offset that its transaction's commit made the group's."""

    group_id: str
    partition: TopicPartition
    offset: OffsetAndMetadata
    staged_at: int  # the log offset of the OffsetStaged record


@dataclass(frozen=True, slots=True)
class OffsetRemoved:
    group_id: str
    partition: TopicPartition


@dataclass(frozen=True, slots=True)
class StagedOffsetRemoved:
    group_id: str
    producer_id: int
    partition: TopicPartition


@dataclass(frozen=True, slots=True)
class OffsetStaged:
    group_id: str
    producer_id: int
    producer_epoch: int
    partition: TopicPartition
    offset: OffsetAndMetadata


@dataclass(frozen=True, slots=True)
class TransactionCompleted:
    producer_id: int
    commit: bool
    offsets_logged: bool = True  # False only in records written before compaction
    coordinator_epoch: int = -1  # -1 in records written before coordinators moved


@dataclass(frozen=True, slots=True)
class StoredMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    subscription: bytes  # the member's metadata for the selected protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupStored:
    group_id: str
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader_id: str | None
    members: tuple[StoredMember, ...]


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    group_id: str


CoordinatorRecord = (
    OffsetCommitted
    | OffsetCommittedInTransaction
    | OffsetRemoved
    | OffsetStaged
    | StagedOffsetRemoved
    | TransactionCompleted
    | GroupStored
    | GroupDeleted
)


def encode(record: CoordinatorRecord) -> tuple[bytes, bytes | None]:
    key: list[Any]
    value: dict[str, Any] | None
    match record:
        case OffsetCommitted(group_id, (topic, partition), offset):
            key = ["offset", group_id, topic, partition]
            value = _offset_json(offset)
        case OffsetCommittedInTransaction(group_id, (topic, partition), offset, staged_at):
            key = ["offset", group_id, topic, partition]
            value = {**_offset_json(offset), "staged_at": staged_at}
        case OffsetRemoved(group_id, (topic, partition)):
            key = ["offset", group_id, topic, partition]
            value = None
        case OffsetStaged(group_id, producer_id, producer_epoch, (topic, partition), offset):
            key = ["txn_offset", group_id, producer_id, topic, partition]
            value = {**_offset_json(offset), "producer_epoch": producer_epoch}
        case StagedOffsetRemoved(group_id, producer_id, (topic, partition)):
            key = ["txn_offset", group_id, producer_id, topic, partition]
            value = None
        case TransactionCompleted(producer_id, commit, offsets_logged, coordinator_epoch):
            key = ["txn_end", producer_id]
            value = {
                "commit": commit,
                "offsets_logged": offsets_logged,
                "coordinator_epoch": coordinator_epoch,
            }
        case GroupStored():
            key = ["group", record.group_id]
            value = {
                "generation_id": record.generation_id,
                "protocol_type": record.protocol_type,
                "protocol_name": record.protocol_name,
                "leader_id": record.leader_id,
                "members": [_member_json(member) for member in record.members],
            }
        case GroupDeleted(group_id):
            key = ["group", group_id]
            value = None
    return _pack(key), None if value is None else _pack(value)


def decode(key: bytes | None, value: bytes | None) -> CoordinatorRecord:
    try:
        fields = _unpack(key)
        body = None if value is None else _unpack(value)
        match fields:
            case ["offset", str(group_id), str(topic), int(partition)] if body is None:
                return OffsetRemoved(group_id, TopicPartition(topic, partition))
            case ["offset", str(group_id), str(topic), int(partition)] if body and "staged_at" in body:
                return OffsetCommittedInTransaction(
                    group_id, TopicPartition(topic, partition), _offset(body), body["staged_at"]
                )
            case ["offset", str(group_id), str(topic), int(partition)] if body is not None:
                return OffsetCommitted(group_id, TopicPartition(topic, partition), _offset(body))
            case ["txn_offset", str(group_id), int(producer_id), str(topic), int(partition)] if body is None:
                return StagedOffsetRemoved(group_id, producer_id, TopicPartition(topic, partition))
            case ["txn_offset", str(group_id), int(producer_id), str(topic), int(partition)] if body:
                return OffsetStaged(
                    group_id,
                    producer_id,
                    body["producer_epoch"],
                    TopicPartition(topic, partition),
                    _offset(body),
                )
            case ["txn_end", int(producer_id)] if body is not None:
                return TransactionCompleted(
                    producer_id,
                    bool(body["commit"]),
                    bool(body.get("offsets_logged", False)),
                    int(body.get("coordinator_epoch", -1)),
                )
            case ["group", str(group_id)] if body is None:
                return GroupDeleted(group_id)
            case ["group", str(group_id)]:
                assert body is not None
                return GroupStored(
                    group_id,
                    body["generation_id"],
                    body["protocol_type"],
                    body["protocol_name"],
                    body["leader_id"],
                    tuple(_member(member) for member in body["members"]),
                )
    except (KeyError, TypeError, ValueError) as error:
        raise RecordFormatError(f"unreadable coordinator record: {error}") from error
    raise RecordFormatError(f"unknown coordinator record key {fields!r}")


def _pack(content: Any) -> bytes:
    return bytes([FORMAT_VERSION]) + json.dumps(content, separators=(",", ":")).encode()


def _unpack(data: bytes | None) -> Any:
    if not data or data[0] != FORMAT_VERSION:
        raise RecordFormatError("missing or unknown record format version")
    return json.loads(data[1:])


def _offset_json(offset: OffsetAndMetadata) -> dict[str, Any]:
    return {
        "offset": offset.offset,
        "leader_epoch": offset.leader_epoch,
        "metadata": offset.metadata,
        "timestamp": offset.commit_timestamp_ms,
    }


def _offset(body: dict[str, Any]) -> OffsetAndMetadata:
    return OffsetAndMetadata(body["offset"], body["leader_epoch"], body["metadata"], body["timestamp"])


def _member_json(member: StoredMember) -> dict[str, Any]:
    return {
        "member_id": member.member_id,
        "group_instance_id": member.group_instance_id,
        "client_id": member.client_id,
        "client_host": member.client_host,
        "session_timeout_ms": member.session_timeout_ms,
        "rebalance_timeout_ms": member.rebalance_timeout_ms,
        "subscription": base64.b64encode(member.subscription).decode(),
        "assignment": base64.b64encode(member.assignment).decode(),
    }


def _member(body: dict[str, Any]) -> StoredMember:
    return StoredMember(
        body["member_id"],
        body["group_instance_id"],
        body["client_id"],
        body["client_host"],
        body["session_timeout_ms"],
        body["rebalance_timeout_ms"],
        base64.b64decode(body["subscription"]),
        base64.b64decode(body["assignment"]),
    )
