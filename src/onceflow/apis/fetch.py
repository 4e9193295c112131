"""Fetch (1): read whole stored batches, long-polling for min_bytes.

read_committed fetches stop at the last stable offset and list the aborted transactions
in the range, which the client uses to drop their batches (docs/design.md#committed-reads).

Fetch sessions (KIP-227) are kept for followers only (`broker/fetch_sessions.py`); clients'
are declined: their answers carry session id 0, so they keep sending full fetch requests,
which Kafka allows.

v13+ name topics by id (KIP-516). v15's replica state, v17's replica directory id and v18's
follower high watermark matter only for followers' fetches; v16 adds the leaders' endpoints
(KIP-951).
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request, leader_endpoints, topic_name
from onceflow.broker.core import Broker, now_ms
from onceflow.broker.fetch_sessions import FetchSession
from onceflow.log.errors import LogError
from onceflow.log.log import PartitionLog

API_KEY = 1
MIN_VERSION = 4
MAX_VERSION = 18

FIRST_VERSION_WITH_TOPIC_IDS = 13

READ_COMMITTED = 1
# The errors whose partitions carry the current leader, with its endpoint in v16+ (KIP-951).
_LEADER_MOVED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)


def handle(request: Request) -> Any:
    body = request.body
    replica_id = _replica_id(body)
    follower = _is_follower(request.broker, replica_id)
    # Sessions exist from v7; older requests have neither field. Kept for brokers of the cluster
    # that name topics (onceflow's followers fetch at v12), declined for everyone else.
    session_id, epoch = getattr(body, "session_id", 0), getattr(body, "session_epoch", -1)
    session = None
    kept = (
        follower
        and replica_id in request.broker.metadata.brokers
        and request.api_version < FIRST_VERSION_WITH_TOPIC_IDS
    )
    if kept and session_id != 0 and epoch in (0, -1):
        # KIP-227: epoch -1 (FINAL) closes the session and fetches without one; 0 replaces it.
        request.broker.fetch_sessions.close(replica_id, session_id)
    if kept and epoch == 0:
        session = request.broker.fetch_sessions.open(replica_id, body.topics)
    elif kept and epoch > 0:
        found = request.broker.fetch_sessions.next_fetch(replica_id, session_id, epoch)
        if isinstance(found, ErrorCode):
            return request.respond(throttle_time=0, error_code=found, session_id=0, responses=[])
        session = found
        session.update(body.topics, body.forgotten_topics_data)
    elif session_id != 0 and epoch != -1:
        return request.respond(
            throttle_time=0, error_code=ErrorCode.fetch_session_id_not_found, session_id=0, responses=[]
        )
    topics = body.topics if session is None else session.topics()
    responses, size, reads = _read(request, topics, session)
    max_wait_ms = body.max_wait.total_seconds() * 1000
    if _enough(request, responses, size) or max_wait_ms <= 0:
        return _respond(request, responses, session)
    # The wait starts from the logs as read here: an append (a follower's) or a high watermark
    # move (a consumer's) in the gap before the coroutine below runs ends it at once.
    seen = request.broker.read_positions(reads, follower)
    return _long_poll(request, topics, session, reads, seen, follower, time.monotonic() + max_wait_ms / 1000)


async def _long_poll(
    request: Request,
    topics: Any,
    session: FetchSession | None,
    reads: list[tuple[str, int, PartitionLog]],
    seen: list[int],
    follower: bool,
    deadline: float,
) -> Any:
    """Wait for the partitions read (a move of one's high watermark wakes this fetch; an
    append, a follower's), read again."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        await request.broker.wait_for_data(reads, remaining, seen, follower)
        responses, size, reads = _read(request, topics, session)
        seen = request.broker.read_positions(reads, follower)
        if _enough(request, responses, size):
            return _respond(request, responses, session)
    return _respond(request, _read(request, topics, session)[0], session)


def _enough(request: Request, responses: list[dict[str, Any]], size: int) -> bool:
    """Whether to answer now: min_bytes of records, or an error for a partition (a moved
    leader, an offset out of range), which the client should hear at once, as Kafka's do."""
    return size >= request.body.min_bytes or any(
        partition["error_code"] != ErrorCode.none for topic in responses for partition in topic["partitions"]
    )


def _is_follower(broker: Broker, replica_id: int) -> bool:
    """Whether the fetch says it comes from another broker of a cluster: a follower, which is
    refused (NOT_LEADER_OR_FOLLOWER) for a partition it holds no replica of, as Kafka's leaders
    do. A single broker has no followers: it reads for a replica id as for a consumer."""
    return replica_id >= 0 and replica_id != broker.node_id and broker.cluster is not None


def _replica_id(body: Any) -> int:
    """The fetching follower's broker id (from v15 in the replica state), -1 for a consumer."""
    replica_state = getattr(body, "replica_state", None)
    return int(getattr(body, "replica_id", -1) if replica_state is None else replica_state.replica_id)


def _respond(request: Request, responses: list[dict[str, Any]], session: FetchSession | None) -> Any:
    if session is not None:
        responses = session.changes(responses)
    metrics = request.broker.metrics
    for topic in responses:
        size = sum(len(partition["records"] or b"") for partition in topic["partitions"])
        if size:
            metrics.sent(topic["topic"], size)
    partitions = (partition for topic in responses for partition in topic["partitions"])
    return request.respond(
        throttle_time=0,
        error_code=ErrorCode.none,
        session_id=0 if session is None else session.session_id,
        responses=responses,
        node_endpoints=leader_endpoints(request, partitions, _LEADER_MOVED),
    )


def _read(
    request: Request, topics: Any, session: FetchSession | None
) -> tuple[list[dict[str, Any]], int, list[tuple[str, int, PartitionLog]]]:
    """The response's topics for the requested `topics` (`session`'s partitions in a session
    fetch), the bytes of records in them, and the partitions read, with their logs."""
    body = request.body
    broker = request.broker
    logs = broker.logs
    # A follower (cluster mode) reads to the leader's log end, past the high watermark and
    # whether fsynced or not: the leader's fsync and the copying run side by side (the high
    # watermark waits for both).
    replica_id = _replica_id(body)
    follower = _is_follower(broker, replica_id)
    read_committed = body.isolation_level == READ_COMMITTED and not follower
    # The broker's own cap bounds the memory one response takes, whatever the client asks for;
    # a negative limit from the wire counts as 0 (KIP-74 still sends the first batch).
    budget = max(0, min(body.max_bytes, broker.config.fetch_max_bytes))
    total = 0
    responses = []
    reads = []
    now = now_ms()
    if session is not None:
        broker.recheck_quiet(replica_id, session.partitions.values(), now)
    for topic in topics:
        topic_id = getattr(topic, "topic_id", None)
        name = topic_name(request, getattr(topic, "topic", None), topic_id, FIRST_VERSION_WITH_TOPIC_IDS)
        if name is None:
            unknown = [
                _partition_error(wanted.partition, ErrorCode.unknown_topic_id) for wanted in topic.partitions
            ]
            responses.append({"topic": None, "topic_id": topic_id, "partitions": unknown})
            continue
        partitions = []
        for wanted in topic.partitions:
            if session is not None:
                if wanted.quiet is not None:  # still caught up: nothing to tell
                    reads.append((name, wanted.partition, wanted.quiet.partition.log))
                    continue
                caught_up = broker.follower_caught_up(name, replica_id, wanted, now)
                if caught_up is not None:  # nothing new to answer for it (`FetchSession.changes`)
                    reads.append((name, wanted.partition, caught_up))
                    continue
            # In a cluster only the partition's leader answers fetches.
            if broker.leader_elsewhere(name, wanted.partition):
                moved = _partition_error(wanted.partition, ErrorCode.not_leader_or_follower)
                leader = broker.current_leader(name, wanted.partition)
                partitions.append(moved if leader is None else {**moved, "current_leader": leader})
                continue
            fenced = _fenced(broker, name, wanted)
            if fenced is not None:
                partitions.append(fenced)
                continue
            log = logs.get(name, wanted.partition)
            if log is None:
                partitions.append(_partition_error(wanted.partition, ErrorCode.unknown_topic_or_partition))
                continue
            if follower and not broker.is_replica(name, wanted.partition, replica_id):
                # A broker that holds no replica reads nothing past the high watermark.
                partitions.append(_partition_error(wanted.partition, ErrorCode.not_leader_or_follower))
                continue
            if follower:
                broker.follower_fetched(name, wanted.partition, replica_id, wanted.fetch_offset)
            hw = broker.high_watermark(name, wanted.partition, log)
            lso = log.last_stable_offset(hw)
            limit = max(0, min(wanted.partition_max_bytes, budget))
            upto = log.log_end_offset if follower else lso if read_committed else hw
            reads.append((name, wanted.partition, log))
            try:
                records, next_offset = log.read_batches(wanted.fetch_offset, limit, upto)
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
                    for entry in log.aborted_transactions(wanted.fetch_offset, next_offset)
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
        responses.append({"topic": name, "topic_id": topic_id, "partitions": partitions})
    return responses, total, reads


def _fenced(broker: Broker, topic: str, wanted: Any) -> dict[str, Any] | None:
    """KIP-320: a fetch naming another leader epoch than this leader's (from v9, -1 when the
    fetcher does not know it) gets FENCED_LEADER_EPOCH if it is older, UNKNOWN_LEADER_EPOCH if
    newer: a follower with a stale view must not copy, nor report an end, from this leader."""
    current = getattr(wanted, "current_leader_epoch", -1)
    leading = broker.leader_epoch(topic, wanted.partition)
    if current < 0 or leading is None or current == leading:
        return None
    if current > leading:
        return _partition_error(wanted.partition, ErrorCode.unknown_leader_epoch)
    fenced = _partition_error(wanted.partition, ErrorCode.fenced_leader_epoch)
    leader = broker.current_leader(topic, wanted.partition)
    return fenced if leader is None else {**fenced, "current_leader": leader}


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
