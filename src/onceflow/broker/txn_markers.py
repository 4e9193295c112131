"""Transaction markers, after Kafka's TransactionMarkerChannelManager and its WriteTxnMarkers.

A partition's leader writes the COMMIT or ABORT marker (`write_as_leader`, which WriteTxnMarkers
serves) and answers once it is committed: fsynced and copied by the partition's ISR. A marker for
a partition of `__consumer_offsets` settles the offsets the producer staged there, in the group
coordinator of that partition. Each marker carries the epoch of the transaction coordinator that
sends it; a partition refuses one from an older coordinator than the last it heard from about
that producer (TRANSACTION_COORDINATOR_FENCED): a coordinator deposed while paused must not end
the producer's next transaction.

The coordinator sends each marker to the partition's current leader, itself included
(`MarkerWriter`), and a marker counts only once that leader answered: a leader that moved or did
not get its ISR to copy the marker in time is asked again (the new leader may not have it), until
the marker is written, the partition is gone, or the coordinator is fenced or lost its own
partition. A marker written twice is harmless: the second finds no open transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from onceflow import failpoints
from onceflow.broker.inter_broker import request_once
from onceflow.coordinator.runtime import UNFENCED_MARKERS, DurableLog, is_internal
from onceflow.internal_topics import CONSUMER_OFFSETS_TOPIC
from onceflow.log.batch import encode_control_batch, validate_batches
from onceflow.log.errors import LogAppendError, LogError

if TYPE_CHECKING:
    from onceflow.broker.core import Broker

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

WRITE_TXN_MARKERS = 27
WRITE_TXN_MARKERS_VERSION = 1
# As Kafka's request.timeout.ms for markers: how long a leader waits for its ISR to copy one.
REPLICATION_TIMEOUT_S = 30.0
RETRY_AFTER_S = 0.2


class CoordinatorFencedError(Exception):
    """A newer transaction coordinator owns the transaction: this one's phase two stops."""


def append_marker(
    broker: Broker,
    partition: TopicPartition,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    now_ms: int,
) -> list[DurableLog]:
    """Write the marker on a partition this broker leads; the logs to wait on (none when
    there was nothing to write). Raises LogError with the code to answer."""
    topic, index = partition
    if broker.leader_elsewhere(topic, index):
        raise LogAppendError(ErrorCode.not_leader_or_follower, f"this broker does not lead {topic}-{index}")
    if topic == CONSUMER_OFFSETS_TOPIC:
        shard = broker.groups.for_partition(index)
        if isinstance(shard, ErrorCode):
            moved = shard == ErrorCode.not_coordinator
            raise LogAppendError(ErrorCode.not_leader_or_follower if moved else shard, f"{topic}-{index}")
        return shard.coordinator.complete_transaction(
            producer_id, producer_epoch, commit, coordinator_epoch, now_ms
        )
    partition_log = broker.logs.get(topic, index)
    if partition_log is None or is_internal(topic):
        raise LogAppendError(ErrorCode.unknown_topic_or_partition, f"{topic}-{index} takes no markers")
    if not failpoints.armed(UNFENCED_MARKERS):
        partition_log.producer_state.check_coordinator_epoch(producer_id, coordinator_epoch)
    marker = encode_control_batch(producer_id, producer_epoch, commit, coordinator_epoch, now_ms)
    partition_log.append(
        marker, validate_batches(marker), now_ms, leader_epoch=broker.leader_epoch(topic, index)
    )
    return [partition_log]


async def write_as_leader(
    broker: Broker,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: Sequence[TopicPartition],
    now_ms: int,
) -> dict[TopicPartition, ErrorCode]:
    """Write the marker on each partition this broker leads; the error code of each once it is
    committed."""
    results: dict[TopicPartition, ErrorCode] = {}
    written: dict[TopicPartition, list[DurableLog]] = {}
    for partition in partitions:
        try:
            written[partition] = append_marker(
                broker, partition, producer_id, producer_epoch, commit, coordinator_epoch, now_ms
            )
        except LogError as error:
            results[partition] = error.error_code
            continue
        results[partition] = ErrorCode.none
    broker.appended([durable for logs in written.values() for durable in logs])
    committed = await asyncio.gather(
        *(broker.wait_committed(logs, REPLICATION_TIMEOUT_S) for logs in written.values())
    )
    results.update(zip(written, committed, strict=True))
    return results


class MarkerWriter:
    """The coordinator's side: each marker to the partition's current leader, until written."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def write(
        self,
        partition: TopicPartition,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        current: Callable[[], bool],
    ) -> asyncio.Task[None]:
        """A task that ends once the partition's leader has the marker, or the partition is gone;
        it fails with CoordinatorFencedError once the coordinator is fenced or (`current()` false)
        no longer holds its partition."""
        return asyncio.create_task(
            self._until_written(partition, producer_id, producer_epoch, commit, coordinator_epoch, current),
            name=f"marker-{partition[0]}-{partition[1]}-{producer_id}",
        )

    async def _until_written(
        self,
        partition: TopicPartition,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        current: Callable[[], bool],
    ) -> None:
        broker = self._broker
        while True:
            # Before this broker has joined its view is empty, which says nothing of the partition yet.
            joined = bool(broker.metadata.brokers)
            if joined and not broker.partition_exists(partition):
                return  # deleted meanwhile: nothing left to mark
            code = ErrorCode.broker_not_available
            if joined:
                code = await self._ask_leader(
                    partition, producer_id, producer_epoch, commit, coordinator_epoch
                )
            if code == ErrorCode.none:
                return
            if code == ErrorCode.transaction_coordinator_fenced:
                raise CoordinatorFencedError(
                    f"{partition[0]}-{partition[1]} has heard from a newer coordinator than epoch "
                    f"{coordinator_epoch} about producer {producer_id}"
                )
            if not current():
                raise CoordinatorFencedError(
                    f"the coordinator of epoch {coordinator_epoch} lost its partition"
                )
            log.info("marker for producer %d on %s-%d: %s, retrying", producer_id, *partition, code.name)
            await asyncio.sleep(RETRY_AFTER_S)

    async def _ask_leader(
        self,
        partition: TopicPartition,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> ErrorCode:
        broker = self._broker
        view = broker.metadata
        leader_id = view.leader(*partition)
        if leader_id == broker.node_id:
            written = await write_as_leader(
                broker,
                producer_id,
                producer_epoch,
                commit,
                coordinator_epoch,
                [partition],
                int(time.time() * 1000),
            )
            return written[partition]
        leader = view.brokers.get(leader_id)
        if leader is None:
            return ErrorCode.leader_not_available
        fields = {
            "markers": [
                {
                    "producer_id": producer_id,
                    "producer_epoch": producer_epoch,
                    "transaction_result": commit,
                    "topics": [{"name": partition[0], "partition_indexes": [partition[1]]}],
                    "coordinator_epoch": coordinator_epoch,
                }
            ]
        }
        try:
            answer = await asyncio.wait_for(
                request_once(
                    (leader.host, leader.port),
                    broker.node_id,
                    WRITE_TXN_MARKERS,
                    WRITE_TXN_MARKERS_VERSION,
                    fields,
                    broker.inter_broker,
                ),
                REPLICATION_TIMEOUT_S + 5,
            )
        except (OSError, TimeoutError, ValueError) as error:
            why = str(error) or type(error).__name__  # a timeout says nothing of itself
            log.info("marker for producer %d on %s-%d: %s", producer_id, *partition, why)
            return ErrorCode.network_exception
        return ErrorCode(answer.markers[0].topics[0].partitions[0].error_code)
