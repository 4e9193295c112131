"""Produce (0): validate batches, append them, and answer per acks.

Batches are stored as received, never copied: the log writes their base offset and leader
epoch ahead of the rest of the bytes kio decoded.
acks=-1 answers after fsync (shared with concurrent requests), acks=1 after
the append, acks=0 not at all.

v10 adds the leaders' endpoints (KIP-951); v11 allows TRANSACTION_ABORTABLE, which this broker
has no cause to answer; v12 lets a client with transaction version 2 (KIP-890) skip
AddPartitionsToTxn, which no client may do here: the broker does not advertise that feature;
v13 names topics by id (KIP-516).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, leader_endpoints, topic_name
from onceflow.broker.core import now_ms
from onceflow.broker.metrics import STAGE_DECODE_TO_APPEND, STAGE_FSYNC_WAIT
from onceflow.coordinator.runtime import is_internal
from onceflow.log.batch import BatchHeader, CorruptRecordError, validate_batches
from onceflow.log.errors import LogError
from onceflow.log.log import PartitionLog

API_KEY = 0
MIN_VERSION = 3
MAX_VERSION = 13

FIRST_VERSION_WITH_TOPIC_IDS = 13

_VALID_ACKS = (-1, 0, 1)


def handle(request: Request) -> Any:
    body = request.body
    acks = body.acks
    appended: list[PartitionLog] = []
    responses = []
    answered: list[dict[str, Any]] = []
    for topic in body.topic_data:
        name = topic_name(
            request,
            getattr(topic, "name", None),
            getattr(topic, "topic_id", None),
            FIRST_VERSION_WITH_TOPIC_IDS,
        )
        partitions = []
        for data in topic.partition_data:
            if name is None:
                result = _error(ErrorCode.unknown_topic_id, f"no topic has the id {topic.topic_id}")
            else:
                result = _produce_partition(request, acks, name, data.index, data.records, appended)
            partitions.append({"index": data.index, **result})
        answered += partitions
        responses.append(
            {"name": name, "topic_id": getattr(topic, "topic_id", None), "partition_responses": partitions}
        )
    appended_at = time.perf_counter()
    if appended:
        request.broker.appended(appended)
        request.broker.metrics.stage(STAGE_DECODE_TO_APPEND, appended_at - request.stamps.received)
    if acks == 0:
        return None
    if acks == -1 and appended:
        # What this request appended, taken now: a wait that took the logs' ends later would
        # also wait for every batch appended meanwhile, and under load keep chasing them.
        durable = request.broker.wait_durable(appended)
        targets = _replication_targets(request, responses)
        if targets:
            # The high watermark waits for that fsync too: awaiting it here would add nothing.
            return _once_replicated(request, targets, responses, answered)
        return _once_fsynced(request, durable, _respond(request, responses, answered), appended_at)
    return _respond(request, responses, answered)


async def _once_fsynced(
    request: Request, durable: Awaitable[float], response: Any, appended_at: float
) -> Any:
    """The answer once the appends are durable, with the fsync wait timed."""
    durable_at = request.stamps.durable = await durable
    request.broker.metrics.stage(STAGE_FSYNC_WAIT, durable_at - appended_at)
    return response


def _respond(request: Request, responses: list[dict[str, Any]], answered: list[dict[str, Any]]) -> Any:
    return request.respond(
        responses=responses,
        throttle_time=0,
        node_endpoints=leader_endpoints(request, answered, (ErrorCode.not_leader_or_follower,)),
    )


def _replication_targets(
    request: Request, responses: list[dict[str, Any]]
) -> list[tuple[str, int, PartitionLog, int]]:
    """Each partition appended to that has other replicas (a partition this broker holds
    alone is committed once fsynced), with its log end right after this request's append."""
    broker = request.broker
    return [
        (topic["name"], partition["index"], replica.log, replica.log.log_end_offset)
        for topic in responses
        for partition in topic["partition_responses"]
        if partition["error_code"] == ErrorCode.none
        and (replica := broker.partition(topic["name"], partition["index"])) is not None
        and len(replica.replicas) > 1
    ]


async def _once_replicated(
    request: Request,
    targets: list[tuple[str, int, PartitionLog, int]],
    responses: list[dict[str, Any]],
    answered: list[dict[str, Any]],
) -> Any:
    """acks=all on partitions with other replicas: the answer once the high watermark (every
    ISR member) passed the appended batches (no further than the leader's fsynced offset:
    `Partition.high_watermark`); REQUEST_TIMED_OUT past the request's timeout,
    NOT_LEADER_OR_FOLLOWER if leadership moved meanwhile (the client retries either)."""
    replicated = await request.broker.wait_replicated(targets, request.body.timeout.total_seconds())
    for topic in responses:
        for partition in topic["partition_responses"]:
            code = replicated.get((topic["name"], partition["index"]), ErrorCode.none)
            if code != ErrorCode.none:
                partition.update(_error(code, _NOT_REPLICATED[code]))
    return _respond(request, responses, answered)


_NOT_REPLICATED = {
    ErrorCode.request_timed_out: "the in-sync replicas did not all copy the batch in time",
    ErrorCode.not_leader_or_follower: "this broker stopped leading the partition before the batch was copied",
    ErrorCode.not_enough_replicas_after_append: "the ISR shrank below min.insync.replicas before the answer",
}


def _produce_partition(
    request: Request,
    acks: int,
    topic: str,
    partition: int,
    records: bytes | None,
    appended: list[PartitionLog],
) -> dict[str, Any]:
    broker = request.broker
    transactional_id = request.body.transactional_id
    if acks not in _VALID_ACKS:
        return _error(ErrorCode.invalid_required_acks, f"acks must be -1, 0 or 1, not {acks}")
    if is_internal(topic):
        return _error(ErrorCode.invalid_topic_exception, f"{topic} is written by its coordinator only")
    if broker.leader_elsewhere(topic, partition):
        moved = _error(ErrorCode.not_leader_or_follower, f"this broker does not lead {topic}-{partition}")
        leader = broker.current_leader(topic, partition)
        return moved if leader is None else {**moved, "current_leader": leader}
    log = broker.logs.get(topic, partition)
    if log is None:
        return _error(ErrorCode.unknown_topic_or_partition, f"{topic}-{partition} does not exist")
    if acks == -1 and broker.min_insync_replicas(topic) > broker.in_sync_replicas(topic, partition):
        message = f"the ISR of {topic}-{partition} is smaller than min.insync.replicas"
        return _error(ErrorCode.not_enough_replicas, message)
    if not records:
        return _error(ErrorCode.corrupt_message, "the partition data holds no record batch")
    try:
        headers = validate_batches(records)
    except CorruptRecordError as error:
        return _error(ErrorCode.corrupt_message, str(error))
    if len(headers) != 1:
        return _error(
            ErrorCode.invalid_record, "a v2 produce request carries exactly one batch per partition"
        )
    batch = headers[0]
    if batch.is_control:
        return _error(
            ErrorCode.invalid_record, "control batches are written by the transaction coordinator only"
        )
    refused = _client_batch_error(batch)
    if refused is not None:
        return _error(ErrorCode.invalid_record, refused)
    if batch.is_transactional:
        # A zombie's late batch must not land in a later transaction of the same id. A leader
        # that is not the coordinator cannot ask, as Kafka's could not before KIP-890: there the
        # partition's producer state refuses an epoch older than the latest it saw.
        coordinator = broker.transactions.for_key(transactional_id or "")
        code = ErrorCode.none
        if not transactional_id:
            code = ErrorCode.invalid_txn_state
        elif not isinstance(coordinator, ErrorCode):
            code = coordinator.coordinator.check_transactional_produce(
                batch.producer_id, batch.producer_epoch, (topic, partition)
            )
        if code != ErrorCode.none:
            return _error(
                code, f"producer {batch.producer_id} has no open transaction on {topic}-{partition}"
            )
    try:
        result = log.append(records, headers, now_ms(), leader_epoch=broker.leader_epoch(topic, partition))
    except LogError as error:
        return _error(error.error_code, str(error))
    # A duplicate is answered only once its original is durable, too.
    appended.append(log)
    if not result.duplicate:
        broker.metrics.stored(topic, len(records), batch.record_count)
    return {
        "error_code": ErrorCode.none,
        "base_offset": result.base_offset,
        "log_start_offset": log.log_start_offset,
        "record_errors": [],
    }


def _client_batch_error(batch: BatchHeader) -> str | None:
    """What Kafka's LogValidator refuses in a client's batch, beyond its CRC: offsets are given
    out by the last offset delta, so it must match the record count, and a batch with a
    producer id must carry a sequence (the duplicate check matches on it)."""
    if batch.record_count <= 0 or batch.record_count != batch.last_offset_delta + 1:
        return (
            f"the batch declares {batch.record_count} records but offsets for "
            f"{batch.last_offset_delta + 1} (last offset delta {batch.last_offset_delta})"
        )
    if batch.producer_id >= 0 and batch.base_sequence < 0:
        return f"producer {batch.producer_id}'s batch has no sequence number ({batch.base_sequence})"
    return None


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": code, "base_offset": -1, "record_errors": [], "error_message": message}
