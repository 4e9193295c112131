"""Fetch (1): read whole stored batches, long-polling for min_bytes.

read_committed fetches stop at the last stable offset and list the aborted transactions
in the range, which the client uses to drop their batches (docs/design.md#committed-reads).

Fetch sessions (KIP-227) are declined: every answer carries session id 0, so
clients keep sending full fetch requests, which Kafka allows.
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.log.batch import next_offset_after
from onceflow.log.errors import LogError

API_KEY = 1
MIN_VERSION = 4
MAX_VERSION = 12

READ_COMMITTED = 1


def handle(request: Request) -> Any:
    body = request.body
    # Sessions exist from v7; older requests have neither field.
    if getattr(body, "session_id", 0) != 0 and body.session_epoch != -1:
        return request.respond(
            throttle_time=0, error_code=ErrorCode.fetch_session_id_not_found, session_id=0, responses=[]
        )
    responses, size = _read(request)
    max_wait_ms = body.max_wait.total_seconds() * 1000
    if size >= body.min_bytes or max_wait_ms <= 0:
        return _respond(request, responses)
    return _long_poll(request, time.monotonic() + max_wait_ms / 1000)


async def _long_poll(request: Request, deadline: float) -> Any:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        await request.broker.wait_for_data(remaining)
        responses, size = _read(request)
        if size >= request.body.min_bytes:
            return _respond(request, responses)
    return _respond(request, _read(request)[0])


def _respond(request: Request, responses: list[dict[str, Any]]) -> Any:
    metrics = request.broker.metrics
    for topic in responses:
        size = sum(len(partition["records"] or b"") for partition in topic["partitions"])
        if size:
            metrics.sent(topic["topic"], size)
    return request.respond(throttle_time=0, error_code=ErrorCode.none, session_id=0, responses=responses)


def _read(request: Request) -> tuple[list[dict[str, Any]], int]:
    body = request.body
    broker = request.broker
    logs = broker.logs
    # A follower (cluster mode) reads what its leader has flushed, past the high watermark.
    follower = getattr(body, "replica_id", -1) >= 0 and broker.cluster is not None
    read_committed = body.isolation_level == READ_COMMITTED and not follower
    # The broker's own cap bounds the memory one response takes, whatever the client asks for.
    budget = min(body.max_bytes, broker.config.get_int("fetch.max.bytes"))
    total = 0
    responses = []
    for topic in body.topics:
        partitions = []
        for wanted in topic.partitions:
            # In a cluster only the partition's leader answers fetches.
            if broker.leader_elsewhere(topic.topic, wanted.partition):
                partitions.append(_partition_error(wanted.partition, ErrorCode.not_leader_or_follower))
                continue
            log = logs.get(topic.topic, wanted.partition)
            if log is None:
                partitions.append(_partition_error(wanted.partition, ErrorCode.unknown_topic_or_partition))
                continue
            if follower:
                broker.follower_fetched(topic.topic, wanted.partition, body.replica_id, wanted.fetch_offset)
            hw = broker.high_watermark(topic.topic, wanted.partition, log)
            lso = log.last_stable_offset(hw)
            limit = min(wanted.partition_max_bytes, budget)
            upto = log.flushed_offset if follower else lso if read_committed else hw
            try:
                records = log.read(wanted.fetch_offset, limit, upto)
            except LogError as error:
                partitions.append(
                    _partition_error(wanted.partition, error.error_code, hw, log.log_start_offset)
                )
                continue
            if total and len(records) > limit:
                # KIP-74: only the first non-empty partition may exceed the limits (by one batch).
                records = b""
            total += len(records)
            budget = max(0, budget - len(records))
            aborted = None
            if read_committed and records:
                aborted = [
                    {"producer_id": entry.producer_id, "first_offset": entry.first_offset}
                    for entry in log.aborted_transactions(wanted.fetch_offset, next_offset_after(records))
                ]
            partitions.append(
                {
                    "partition_index": wanted.partition,
                    "error_code": ErrorCode.none,
                    "high_watermark": hw,
                    "last_stable_offset": lso,
                    "log_start_offset": log.log_start_offset,
                    "aborted_transactions": aborted,
                    "preferred_read_replica": -1,
                    "records": records,
                }
            )
        responses.append({"topic": topic.topic, "partitions": partitions})
    return responses, total


def _partition_error(
    partition: int, code: ErrorCode, high_watermark: int = -1, log_start_offset: int = -1
) -> dict[str, Any]:
    return {
        "partition_index": partition,
        "error_code": code,
        "high_watermark": high_watermark,
        "last_stable_offset": high_watermark,
        "log_start_offset": log_start_offset,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        # Kafka sends empty records, never null: librdkafka cannot parse a null record set
        # and would never see the error (so never apply auto.offset.reset).
        "records": b"",
    }
