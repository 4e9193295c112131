"""The three delivery guarantees as plain librdkafka client configs anyone can copy."""

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
    notes: list[str] = field(default_factory=list)


AT_MOST_ONCE = Preset(
    name="at-most-once",
    summary="fire and forget, commit before processing: a fault may lose a record, never repeat one",
    producer={"acks": 0, "enable.idempotence": False, "retries": 0, "message.timeout.ms": 5000},
    consumer={"enable.auto.commit": False, "isolation.level": "read_uncommitted"},
    commit="before-processing",
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

PRESETS: dict[str, Preset] = {preset.name: preset for preset in (AT_MOST_ONCE, AT_LEAST_ONCE, EXACTLY_ONCE)}
