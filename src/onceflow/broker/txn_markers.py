"""Transaction markers across a cluster, after Kafka's TransactionMarkerChannelManager.

A partition's leader writes the COMMIT or ABORT marker (`write_as_leader`, which WriteTxnMarkers
serves) and answers once it is durable and, in a cluster, once every in-sync replica has it. In
a cluster the transaction coordinator sends each marker to the partition's current leader, itself
included (`ClusterMarkers`), and a marker counts only once that leader answered: a leader that
moved or did not get its ISR to copy the marker in time is asked again (the new leader may not
have it), until the marker is written or the partition is gone. A marker written twice is
harmless: the second finds no open transaction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from onceflow.broker.inter_broker import request_once
from onceflow.coordinator.runtime import is_internal
from onceflow.log.batch import encode_control_batch, validate_batches
from onceflow.log.errors import LogError
from onceflow.log.log import PartitionLog

if TYPE_CHECKING:
    from onceflow.broker.core import Broker

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

WRITE_TXN_MARKERS = 27
WRITE_TXN_MARKERS_VERSION = 1
# As Kafka's request.timeout.ms for markers: how long a leader waits for its ISR to copy one.
REPLICATION_TIMEOUT_S = 30.0
RETRY_AFTER_S = 0.2
COORDINATOR_EPOCH = 0  # the coordinator does not move with an epoch (its log is not replicated)


async def write_as_leader(
    broker: Broker,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: Sequence[TopicPartition],
    now_ms: int,
) -> dict[TopicPartition, ErrorCode]:
    """Append the marker to each partition this broker leads; the error code of each once it
    is durable (and copied by the ISR, in a cluster)."""
    results: dict[TopicPartition, ErrorCode] = {}
    appended: list[tuple[str, int, PartitionLog, int]] = []
    for topic, partition in partitions:
        partition_log = broker.logs.get(topic, partition)
        if broker.leader_elsewhere(topic, partition):
            results[(topic, partition)] = ErrorCode.not_leader_or_follower
        elif partition_log is None or is_internal(topic):
            # The coordinators' logs take no markers: the group coordinator settles offsets.
            results[(topic, partition)] = ErrorCode.unknown_topic_or_partition
        else:
            marker = encode_control_batch(producer_id, producer_epoch, commit, coordinator_epoch, now_ms)
            try:
                partition_log.append(
                    marker,
                    validate_batches(marker),
                    now_ms,
                    leader_epoch=broker.leader_epoch(topic, partition),
                )
            except LogError as error:
                results[(topic, partition)] = error.error_code
                continue
            results[(topic, partition)] = ErrorCode.none
            appended.append((topic, partition, partition_log, partition_log.log_end_offset))
    logs = [partition_log for _, _, partition_log, _ in appended]
    broker.appended(logs)
    await broker.wait_durable(logs)
    if broker.cluster is not None and appended:
        results.update(await broker.wait_replicated(appended, REPLICATION_TIMEOUT_S))
    return results


class ClusterMarkers:
    """The coordinator's side in a cluster: each marker to the partition's current leader."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def write(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool
    ) -> asyncio.Task[None]:
        """A task that ends once the partition's leader has the marker, or the partition is gone."""
        return asyncio.create_task(
            self._until_written(partition, producer_id, producer_epoch, commit),
            name=f"marker-{partition[0]}-{partition[1]}-{producer_id}",
        )

    async def _until_written(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        cluster = self._broker.cluster
        assert cluster is not None
        while True:
            # Before this broker has joined (phase two resumed at a start) its view is empty,
            # which says nothing of the partition yet.
            joined = bool(cluster.view.brokers)
            if joined and not self._broker.partition_exists(partition):
                return  # deleted meanwhile: nothing left to mark
            code = ErrorCode.broker_not_available
            if joined:
                code = await self._ask_leader(partition, producer_id, producer_epoch, commit)
            if code == ErrorCode.none:
                return
            log.info("marker for producer %d on %s-%d: %s, retrying", producer_id, *partition, code.name)
            await asyncio.sleep(RETRY_AFTER_S)

    async def _ask_leader(
        self, partition: TopicPartition, producer_id: int, producer_epoch: int, commit: bool
    ) -> ErrorCode:
        broker = self._broker
        assert broker.cluster is not None
        view = broker.cluster.view
        leader_id = view.leader(*partition)
        if leader_id == broker.node_id:
            written = await write_as_leader(
                broker,
                producer_id,
                producer_epoch,
                commit,
                COORDINATOR_EPOCH,
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
                    "coordinator_epoch": COORDINATOR_EPOCH,
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
