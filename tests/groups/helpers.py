"""Shared by the group tests: raw group requests, and calls into an embedded broker's coordinator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from onceflow.broker.core import Broker, now_ms
from onceflow.coordinator.group import GroupCoordinator
from tests.wire import WireClient

T = TypeVar("T")
PROTOCOL_TYPE = "consumer"


class Pending:
    """A request sent without waiting for its answer (JoinGroup and SyncGroup may wait long)."""

    def __init__(self, client: WireClient, api_key: int, version: int, **fields: Any) -> None:
        self.client, self.api_key, self.version = client, api_key, version
        self.correlation_id, frame = client.frame(api_key, version, **fields)
        client.send_raw(frame)

    def result(self) -> Any:
        return self.client.read_response(self.api_key, self.version, self.correlation_id)


def send_join(
    client: WireClient,
    group: str,
    member_id: str = "",
    *,
    version: int = 5,
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"subscription"),),
    protocol_type: str = PROTOCOL_TYPE,
    session_ms: int = 10_000,
    rebalance_ms: int = 10_000,
    instance_id: str | None = None,
) -> Pending:
    return Pending(
        client,
        11,
        version,
        group_id=group,
        session_timeout=session_ms,
        rebalance_timeout=rebalance_ms,
        member_id=member_id,
        group_instance_id=instance_id,
        protocol_type=protocol_type,
        protocols=[{"name": name, "metadata": metadata} for name, metadata in protocols],
    )


def join(client: WireClient, group: str, member_id: str = "", **options: Any) -> Any:
    return send_join(client, group, member_id, **options).result()


def join_new(client: WireClient, group: str, **options: Any) -> Any:
    """Join as a new member: MEMBER_ID_REQUIRED first (v4+), then with that id."""
    first = join(client, group, **options)
    if first.error_code != ErrorCode.member_id_required:
        return first
    return join(client, group, first.member_id, **options)


def send_sync(
    client: WireClient,
    group: str,
    generation: int,
    member_id: str,
    assignments: dict[str, bytes] | None = None,
    instance_id: str | None = None,
) -> Pending:
    return Pending(
        client,
        14,
        3,
        group_id=group,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=instance_id,
        assignments=[{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()],
    )


def sync(client: WireClient, group: str, generation: int, member_id: str, **options: Any) -> Any:
    return send_sync(client, group, generation, member_id, **options).result()


def heartbeat(
    client: WireClient, group: str, generation: int, member_id: str, instance_id: str | None = None
) -> ErrorCode:
    response = client.request(
        12, 3, group_id=group, generation_id=generation, member_id=member_id, group_instance_id=instance_id
    )
    return response.error_code  # type: ignore[no-any-return]


def commit(
    client: WireClient,
    group: str,
    offsets: dict[tuple[str, int], int],
    generation: int = -1,
    member_id: str = "",
    instance_id: str | None = None,
    version: int = 8,
) -> dict[tuple[str, int], ErrorCode]:
    response = client.request(
        8,
        version,
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=instance_id,
        retention_time=-1,
        topics=_offset_topics(offsets),
    )
    return {
        (topic.name, partition.partition_index): partition.error_code
        for topic in response.topics
        for partition in topic.partitions
    }


# The transactional id of each producer id `begin_offsets_transaction` started, which
# `txn_commit` names: the broker finds the transaction's coordinator by it.
TRANSACTIONAL_IDS: dict[int, str] = {}


def begin_offsets_transaction(client: WireClient, transactional_id: str, group: str) -> int:
    """A transactional session whose open transaction holds `group`'s offsets, as
    send_offsets_to_transaction starts one (InitProducerId, AddOffsetsToTxn); its producer id."""
    session = client.init_producer_id(transactional_id)
    assert session.error_code == ErrorCode.none
    added = client.request(
        25,
        3,
        transactional_id=transactional_id,
        producer_id=session.producer_id,
        producer_epoch=session.producer_epoch,
        group_id=group,
    )
    assert added.error_code == ErrorCode.none
    TRANSACTIONAL_IDS[int(session.producer_id)] = transactional_id
    return int(session.producer_id)


def txn_commit(
    client: WireClient,
    group: str,
    producer_id: int,
    offsets: dict[tuple[str, int], int],
    generation: int = -1,
    member_id: str = "",
    instance_id: str | None = None,
    version: int = 3,
) -> dict[tuple[str, int], ErrorCode]:
    response = client.request(
        28,
        version,
        transactional_id=TRANSACTIONAL_IDS.get(producer_id, "txn"),
        group_id=group,
        producer_id=producer_id,
        producer_epoch=0,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=instance_id,
        topics=_offset_topics(offsets),
    )
    return {
        (topic.name, partition.partition_index): partition.error_code
        for topic in response.topics
        for partition in topic.partitions
    }


def fetch(
    client: WireClient, group: str, partitions: list[tuple[str, int]] | None, require_stable: bool = False
) -> dict[tuple[str, int], tuple[int, ErrorCode]]:
    """(offset, error) per partition, through OffsetFetch v7."""
    topics: dict[str, list[int]] = {}
    for topic, partition in partitions or []:
        topics.setdefault(topic, []).append(partition)
    response = client.request(
        9,
        7,
        group_id=group,
        topics=None
        if partitions is None
        else [{"name": name, "partition_indexes": indexes} for name, indexes in topics.items()],
        require_stable=require_stable,
    )
    assert response.error_code == ErrorCode.none
    return {
        (topic.name, partition.partition_index): (partition.committed_offset, partition.error_code)
        for topic in response.topics
        for partition in topic.partitions
    }


def describe(client: WireClient, group: str, version: int = 5) -> Any:
    return client.request(15, version, groups=[group], include_authorized_operations=False).groups[0]


def _offset_topics(offsets: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset,
                "committed_leader_epoch": -1,
                "committed_metadata": None,
            }
        )
    return [{"name": name, "partitions": partitions} for name, partitions in topics.items()]


def on_broker_loop(embedded: EmbeddedBroker, call: Callable[[Broker], Coroutine[Any, Any, T]]) -> T:
    """Run `call(broker)` on the broker's event loop: the coordinator is not thread-safe."""
    assert embedded._loop is not None and embedded._server is not None
    broker = embedded._server.broker
    return asyncio.run_coroutine_threadsafe(call(broker), embedded._loop).result(timeout=30)


def group_shard(broker: Broker, group_id: str) -> GroupCoordinator:
    """The broker's coordinator of `group_id` (on its event loop); `__consumer_offsets` is
    created if it is missing, as a coordinator request would."""
    shard = broker.coordinator(broker.groups, group_id)
    assert not isinstance(shard, ErrorCode), shard
    return shard.coordinator


def complete_transaction(embedded: EmbeddedBroker, group_id: str, producer_id: int, commit: bool) -> None:
    """What a commit or abort marker for the group's partition of `__consumer_offsets` does:
    apply or drop the offsets the producer (at epoch 0) staged."""

    async def complete(broker: Broker) -> None:
        logs = group_shard(broker, group_id).complete_transaction(producer_id, 0, commit, 0, now_ms())
        broker.appended(logs)
        await broker.wait_durable(logs)

    on_broker_loop(embedded, complete)
