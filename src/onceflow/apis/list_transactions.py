"""ListTransactions (66): transactional ids by state, producer id, (v1) how long they run, and
(v2, KIP-1152) a regular expression the whole id matches; a pattern that does not compile is
INVALID_REGULAR_EXPRESSION, as in Kafka (whose patterns are Java's: the common syntax is the same)."""

from __future__ import annotations

import re
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.broker.core import now_ms
from onceflow.coordinator.transaction import TxnState

API_KEY = 66
MIN_VERSION = 0
MAX_VERSION = 2

_STATE_NAMES = {state.value for state in TxnState}


def handle(request: Request) -> Any:
    body = request.body
    wanted_states = set(body.state_filters)
    wanted_producers = set(body.producer_id_filters)
    min_duration_ms = getattr(body, "duration_filter", -1)
    pattern_text = getattr(body, "transactional_id_pattern", None)
    try:
        pattern = re.compile(pattern_text) if pattern_text else None
    except re.error:
        return request.respond(
            throttle_time=0,
            error_code=ErrorCode.invalid_regular_expression,
            unknown_state_filters=[],
            transaction_states=[],
        )
    now = now_ms()
    # The transactional ids this broker coordinates, as Kafka's brokers list them: an admin
    # client asks every broker. While it loads a partition the list would be short: retry then.
    shards = request.broker.transactions
    if shards.loading:
        return request.respond(
            throttle_time=0,
            error_code=ErrorCode.coordinator_load_in_progress,
            unknown_state_filters=[],
            transaction_states=[],
        )
    coordinated = [
        metadata for shard in shards.loaded() for metadata in shard.coordinator.transactions.values()
    ]
    listed = [
        {
            "transactional_id": metadata.transactional_id,
            "producer_id": metadata.producer_id,
            "transaction_state": metadata.state.value,
        }
        for metadata in coordinated
        if (not wanted_states or metadata.state.value in wanted_states)
        and (not wanted_producers or metadata.producer_id in wanted_producers)
        and (min_duration_ms < 0 or (metadata.start_ms >= 0 and now - metadata.start_ms >= min_duration_ms))
        and (pattern is None or pattern.fullmatch(metadata.transactional_id) is not None)
    ]
    return request.respond(
        throttle_time=0,
        error_code=ErrorCode.none,
        unknown_state_filters=sorted(wanted_states - _STATE_NAMES),
        transaction_states=listed,
    )
