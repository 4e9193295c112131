"""Per-log settings, read from Kafka's broker (`log.*`) and topic config keys."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

_INT32_MAX = 2**31 - 1
# Kafka's compression.type values: a codec, or "producer" (keep the producer's).
COMPRESSION_TYPES = ("uncompressed", "gzip", "snappy", "lz4", "zstd", "producer")


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 1024**3
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 3_600_000  # -1: keep forever
    retention_bytes: int = -1  # -1: no size limit
    max_message_bytes: int = 1_048_588
    producer_id_expiration_ms: int = 86_400_000
    flush_interval_ms: int = 1000
    # "delete", "compact" or both ("compact,delete"), as given.
    cleanup_policy: str = "delete"
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5
    # The codec the broker stores batches in (Kafka's topic `compression.type`); "producer":
    # as the producer sent them.
    compression_type: str = "producer"
    compression_levels: tuple[tuple[str, int], ...] = ()  # (codec, level) set by the topic
    # A segment rolls on the first append once it is older than this, less its jitter (roll.py).
    segment_ms: int = 7 * 24 * 3_600_000
    segment_jitter_ms: int = 0

    # Cached: appends ask for every batch (the frozen dataclass's fields never change).
    @functools.cached_property
    def compact(self) -> bool:
        return "compact" in _policies(self.cleanup_policy)

    @functools.cached_property
    def delete(self) -> bool:
        return "delete" in _policies(self.cleanup_policy)

    @classmethod
    def from_kafka(cls, props: Mapping[str, str], base: LogConfig | None = None) -> LogConfig:
        """Overlay the keys this layer understands on `base`; other keys are ignored.

        Later entries of the key table win, so `log.retention.ms` beats minutes and hours
        (as in Kafka), and topic keys beat broker keys.
        """
        changes: dict[str, Any] = {}
        for key in _KEYS:
            raw = props.get(key.name)
            if raw is None:
                continue
            value = _parse_int(key.name, raw) * key.scale
            if key.negative_means_unlimited and value < 0:
                value = -1
            elif key.minimum is not None and value < key.minimum:
                raise ValueError(f"{key.name} must be at least {key.minimum}, got {raw!r}")
            if key.maximum is not None and value > key.maximum:
                raise ValueError(f"{key.name} must be at most {key.maximum}, got {raw!r}")
            changes[key.field] = value
        for name in ("log.cleanup.policy", "cleanup.policy"):
            if name in props:
                # Empty is allowed, as Kafka's ValidList allows it: neither deleted nor compacted.
                policy = str(props[name]).strip()
                if not _policies(policy) <= {"compact", "delete"}:
                    raise ValueError(f"{name} must be delete, compact, both or empty, got {policy!r}")
                changes["cleanup_policy"] = policy
        for name in ("log.cleaner.min.cleanable.ratio", "min.cleanable.dirty.ratio"):
            if name in props:
                changes["min_cleanable_dirty_ratio"] = _parse_ratio(name, props[name])
        if "compression.type" in props:
            codec = str(props["compression.type"]).strip()
            if codec not in COMPRESSION_TYPES:
                choices = ", ".join(COMPRESSION_TYPES)
                raise ValueError(f"compression.type must be one of {choices}, got {codec!r}")
            changes["compression_type"] = codec
        levels = dict((base or cls()).compression_levels)
        for codec in ("gzip", "lz4", "zstd"):
            name = f"compression.{codec}.level"
            if name in props:
                levels[codec] = _parse_int(name, props[name])
        if levels:
            changes["compression_levels"] = tuple(sorted(levels.items()))
        return dataclasses.replace(base or cls(), **changes)


class _Key(NamedTuple):
    name: str
    field: str
    minimum: int | None = None
    maximum: int | None = None
    scale: int = 1
    negative_means_unlimited: bool = False


_KEYS = (
    _Key("log.segment.bytes", "segment_bytes", 14, _INT32_MAX),
    _Key("segment.bytes", "segment_bytes", 14, _INT32_MAX),
    _Key("log.index.interval.bytes", "index_interval_bytes", 0, _INT32_MAX),
    _Key("index.interval.bytes", "index_interval_bytes", 0, _INT32_MAX),
    _Key("log.retention.hours", "retention_ms", scale=3_600_000, negative_means_unlimited=True),
    _Key("log.retention.minutes", "retention_ms", scale=60_000, negative_means_unlimited=True),
    _Key("log.retention.ms", "retention_ms", negative_means_unlimited=True),
    _Key("retention.ms", "retention_ms", negative_means_unlimited=True),
    _Key("log.retention.bytes", "retention_bytes", negative_means_unlimited=True),
    _Key("retention.bytes", "retention_bytes", negative_means_unlimited=True),
    _Key("message.max.bytes", "max_message_bytes", 0, _INT32_MAX),
    _Key("max.message.bytes", "max_message_bytes", 0, _INT32_MAX),
    _Key("producer.id.expiration.ms", "producer_id_expiration_ms", 1, _INT32_MAX),
    _Key("log.flush.interval.ms", "flush_interval_ms", 0),
    _Key("flush.ms", "flush_interval_ms", 0),
    _Key("log.cleaner.delete.retention.ms", "delete_retention_ms", 0),
    _Key("delete.retention.ms", "delete_retention_ms", 0),
    _Key("log.cleaner.min.compaction.lag.ms", "min_compaction_lag_ms", 0),
    _Key("min.compaction.lag.ms", "min_compaction_lag_ms", 0),
    _Key("log.roll.hours", "segment_ms", 1, scale=3_600_000),
    _Key("log.roll.ms", "segment_ms", 1),
    _Key("segment.ms", "segment_ms", 1),
    _Key("log.roll.jitter.hours", "segment_jitter_ms", 0, scale=3_600_000),
    _Key("log.roll.jitter.ms", "segment_jitter_ms", 0),
    _Key("segment.jitter.ms", "segment_jitter_ms", 0),
)


def _policies(policy: str) -> set[str]:
    return {item.strip() for item in policy.split(",") if item.strip()}


def _parse_ratio(key: str, raw: str) -> float:
    try:
        ratio = float(str(raw).strip())
    except ValueError:
        raise ValueError(f"{key} must be a number, got {raw!r}") from None
    if not 0 <= ratio <= 1:
        raise ValueError(f"{key} must be between 0 and 1, got {raw!r}")
    return ratio


def _parse_int(key: str, raw: str) -> int:
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {raw!r}") from None
