"""The delivery guarantees as plain librdkafka client configs anyone can copy: the documents' three,
and at-least-once with the idempotent producer, their formula for exactly-once per partition
within one producer session."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Commit = Literal["before-processing", "after-processing", "in-transaction"]


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    producer: dict[str, str | int | bool]
    consumer: dict[str, str | int | bool]
    commit: Commit
    # A transactional producer acknowledges a value when its transaction commits, not on delivery.
    transactional: bool = False
    # A restarted producer sends again what it never saw acknowledged (at-least-once means retrying
    # until acknowledged, across restarts too); at-most-once goes on after its last send.
    resends_unacknowledged: bool = True
    # Whether a consume-process-produce stage reads what the producers wrote; without one a run
    # judges the producers' writes alone.
    consumes: bool = True
    notes: list[str] = field(default_factory=list)


AT_MOST_ONCE = Preset(
    name="at-most-once",
    summary="fire and forget, commit before processing: a fault may lose a record, never repeat one",
    producer={"acks": 0, "enable.idempotence": False, "retries": 0, "message.timeout.ms": 5000},
    consumer={"enable.auto.commit": False, "isolation.level": "read_uncommitted"},
    commit="before-processing",
    resends_unacknowledged=False,
)

AT_LEAST_ONCE = Preset(
    name="at-least-once",
    summary="acks=all with retries, commit after processing: a fault may repeat a record, never lose one",
    producer={
        "acks": "all",
        "enable.idempotence": False,
        "retries": 2_147_483_647,
        "message.timeout.ms": 120_000,
    },
    consumer={"enable.auto.commit": False, "isolation.level": "read_uncommitted"},
    commit="after-processing",
)

IDEMPOTENT = Preset(
    name="idempotent",
    summary="at-least-once with the idempotent producer: a retry within one producer session is stored"
    " once; a restarted producer is a new session, whose retries duplicate again",
    producer={
        "acks": "all",
        "enable.idempotence": True,
        "retries": 2_147_483_647,
        "message.timeout.ms": 120_000,
    },
    consumer={"enable.auto.commit": False, "isolation.level": "read_uncommitted"},
    commit="after-processing",
    consumes=False,  # the formula is about a producer's writes: a run has producers only
    notes=[
        "the broker keeps the sequence numbers per producer id and partition: a producer restarted"
        " without a transactional id gets a new producer id, and what it sends again is stored again",
    ],
)

EXACTLY_ONCE = Preset(
    name="exactly-once",
    summary="idempotent transactional producer, read_committed, offsets committed in the transaction",
    producer={"acks": "all", "enable.idempotence": True, "transaction.timeout.ms": 10_000},
    consumer={"enable.auto.commit": False, "isolation.level": "read_committed"},
    commit="in-transaction",
    transactional=True,
    notes=[
        "set transactional.id to a name stable across restarts of one worker",
        "commit the consumer's offsets with send_offsets_to_transaction before commit_transaction",
        "with one broker, set metadata.recovery.strategy=none: librdkafka 2.16 re-bootstraps when its only"
        " connection resets, and send_offsets_to_transaction can then hang (librdkafka #5511)",
    ],
)

PRESETS: dict[str, Preset] = {
    preset.name: preset for preset in (AT_MOST_ONCE, AT_LEAST_ONCE, IDEMPOTENT, EXACTLY_ONCE)
}
