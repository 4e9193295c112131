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

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Ordered, Request, leader_endpoints, topic_name
from onceflow.broker.core import now_ms
from onceflow.broker.metrics import STAGE_DECODE_TO_APPEND, STAGE_FSYNC_WAIT
from onceflow.coordinator.runtime import is_internal
from onceflow.log.batch import BatchHeader, CorruptRecordError, validate_batches
from onceflow.log.errors import LogError
from onceflow.log.log import PartitionLog
from onceflow.log.validator import (
    LIGHT_INFLATED_BYTES,
    InflatesPastCap,
    RecordErrors,
    ValidatedBatch,
    is_heavy,
    validate_client_batch,
)

API_KEY = 0
MIN_VERSION = 3
MAX_VERSION = 13
# Kafka 4 advertises v0-2 though it serves none of them: older librdkafka versions fail to
# produce compressed batches unless v0 is listed (KAFKA-18659). A v0-2 request closes the
# connection, as an unknown version does.
ADVERTISED_MIN_VERSION = 0

FIRST_VERSION_WITH_TOPIC_IDS = 13

_VALID_ACKS = (-1, 0, 1)


def handle(request: Request) -> Any:
    body = request.body
    appended: list[PartitionLog] = []
    responses = []
    answered: list[dict[str, Any]] = []
    heavy: list[tuple[dict[str, Any], _Checked]] = []  # validated off the event loop, then appended
    for topic in body.topic_data:
        name = topic_name(
            request,
            getattr(topic, "name", None),
            getattr(topic, "topic_id", None),
            FIRST_VERSION_WITH_TOPIC_IDS,
        )
        partitions = []
        for data in topic.partition_data:
            result: dict[str, Any] = {"index": data.index}
            if name is None:
                result.update(_error(ErrorCode.unknown_topic_id, f"no topic has the id {topic.topic_id}"))
            else:
                checked = _check_partition(request, name, data.index, data.records)
                if isinstance(checked, dict):
                    result.update(checked)
                elif checked.heavy:
                    heavy.append((result, checked))
                else:
                    result.update(_append(request, checked, appended))
            partitions.append(result)
        answered += partitions
        responses.append(
            {"name": name, "topic_id": getattr(topic, "topic_id", None), "partition_responses": partitions}
        )
    if heavy:
        done_appending: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        reply = asyncio.ensure_future(
            _after_heavy_validation(request, heavy, appended, responses, answered, done_appending)
        )
        return Ordered(reply, done_appending)
    return _answer(request, appended, responses, answered)


async def _after_heavy_validation(
    request: Request,
    heavy: list[tuple[dict[str, Any], _Checked]],
    appended: list[PartitionLog],
    responses: list[dict[str, Any]],
    answered: list[dict[str, Any]],
    done_appending: asyncio.Future[None],
) -> Any:
    """Validate the heavy batches on the broker's record thread, then append them on the event
    loop; the connection's next request waits for the appends (its batches come after these)."""
    try:
        for result, checked in heavy:
            try:
                validated = await request.broker.run_record_work(
                    validate_client_batch, checked.records, checked.header, checked.log.config
                )
            except LogError as error:
                result.update(_refusal(error))
                continue
            if not checked.log.closed:
                result.update(_append(request, checked._replace(validated=validated), appended))
            else:
                result.update(_error(ErrorCode.not_leader_or_follower, "the partition went away meanwhile"))
    finally:
        done_appending.set_result(None)
    reply = _answer(request, appended, responses, answered)
    return await reply if isinstance(reply, Awaitable) else reply


def _answer(
    request: Request,
    appended: list[PartitionLog],
    responses: list[dict[str, Any]],
    answered: list[dict[str, Any]],
) -> Any:
    appended_at = time.perf_counter()
    acks = request.body.acks
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


class _Checked(NamedTuple):
    """A partition's batch past the checks that need no record-level work."""

    topic: str
    partition: int
    log: PartitionLog
    records: bytes | bytearray | memoryview
    header: BatchHeader
    heavy: bool
    validated: ValidatedBatch | None = None


def _check_partition(
    request: Request, topic: str, partition: int, records: bytes | None
) -> _Checked | dict[str, Any]:
    """The batch to validate and append, or the error that refuses it."""
    broker = request.broker
    acks = request.body.acks
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
    header = headers[0]
    if header.is_control:
        return _error(
            ErrorCode.invalid_record, "control batches are written by the transaction coordinator only"
        )
    checked = _Checked(topic, partition, log, records, header, is_heavy(header, log.config))
    if checked.heavy:
        return checked
    try:
        validated = validate_client_batch(records, header, log.config, LIGHT_INFLATED_BYTES)
    except InflatesPastCap:
        return checked._replace(heavy=True)
    except LogError as error:
        return _refusal(error)
    return checked._replace(validated=validated)


def _append(request: Request, checked: _Checked, appended: list[PartitionLog]) -> dict[str, Any]:
    """Append a validated batch (on the event loop): the answer's fields for its partition."""
    broker = request.broker
    transactional_id = request.body.transactional_id
    validated = checked.validated
    assert validated is not None
    topic, partition, log, batch = checked.topic, checked.partition, checked.log, validated.header
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
            message = f"producer {batch.producer_id} has no open transaction on {topic}-{partition}"
            return _error(code, message)
    try:
        result = log.append(
            validated.records, [batch], now_ms(), leader_epoch=broker.leader_epoch(topic, partition)
        )
    except LogError as error:
        return _refusal(error, request)
    # A duplicate is answered only once its original is durable, too.
    appended.append(log)
    if not result.duplicate:
        broker.metrics.stored(topic, len(validated.records), batch.record_count)
    return {
        "error_code": ErrorCode.none,
        "base_offset": result.base_offset,
        "log_start_offset": log.log_start_offset,
        "record_errors": [],
    }


def _refusal(error: LogError, request: Request | None = None) -> dict[str, Any]:
    if request is not None and error.error_code == ErrorCode.kafka_storage_error:
        request.broker.metrics.storage_error("append")
    refused = _error(error.error_code, str(error))
    if isinstance(error, RecordErrors):
        refused["record_errors"] = [
            {"batch_index": index, "batch_index_error_message": message}
            for index, message in error.record_errors
        ]
    return refused


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": code, "base_offset": -1, "record_errors": [], "error_message": message}
