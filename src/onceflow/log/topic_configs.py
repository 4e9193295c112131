"""Kafka's topic config keys: their types, their valid values, and which ones this broker applies.

Every key of Kafka 4.0's topic ConfigDef is listed here, in one of three kinds:

- APPLIED: the broker does what the key says (validated by type and range, then `LogConfig`).
- NO_EFFECT: any valid value is accepted and stored, because on a single broker that neither
  replicates, recompresses nor tiers its log, no client could see the difference
  (Kafka itself ignores these keys on such a topic).
- ONLY_DEFAULT: only the value that describes what the broker does is accepted; any other is
  INVALID_CONFIG with a message saying that the broker does not support it, rather than a topic
  that silently behaves otherwise (a client asking for LogAppendTime must not get CreateTime).

Any other key is INVALID_CONFIG, as in Kafka (with the closest known key, if one is close).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from onceflow.log.config_checks import ConfigType, did_you_mean, value_problem
from onceflow.log.errors import InvalidConfigError

LONG_MAX = str(2**63 - 1)


class Support(enum.Enum):
    APPLIED = "applied"
    NO_EFFECT = "no effect"
    ONLY_DEFAULT = "only the default"


@dataclass(frozen=True)
class TopicKey:
    name: str
    type: ConfigType
    support: Support
    # The value when the topic does not set the key: for applied keys the broker-level key
    # decides it (see `broker_key`); for the others it is Kafka's default.
    default: str = ""
    broker_key: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    # Why ONLY_DEFAULT refuses other values.
    unsupported: str = ""


_A, _N, _O = Support.APPLIED, Support.NO_EFFECT, Support.ONLY_DEFAULT
_B, _S, _I, _L, _D, _LIST = (
    ConfigType.BOOLEAN,
    ConfigType.STRING,
    ConfigType.INT,
    ConfigType.LONG,
    ConfigType.DOUBLE,
    ConfigType.LIST,
)

TOPIC_KEYS: dict[str, TopicKey] = {
    key.name: key
    for key in (
        # Applied; LogConfig checks the ranges, and the defaults come from the broker's config.
        TopicKey("segment.bytes", _I, _A, broker_key="log.segment.bytes"),
        TopicKey("index.interval.bytes", _I, _A, broker_key="log.index.interval.bytes"),
        TopicKey("segment.ms", _L, _A, broker_key="log.roll.ms", minimum=1),
        TopicKey("segment.jitter.ms", _L, _A, broker_key="log.roll.jitter.ms", minimum=0),
        TopicKey("retention.ms", _L, _A, broker_key="log.retention.ms"),
        TopicKey("retention.bytes", _L, _A, broker_key="log.retention.bytes"),
        TopicKey("max.message.bytes", _I, _A, broker_key="message.max.bytes"),
        TopicKey("flush.ms", _L, _A, broker_key="log.flush.interval.ms", minimum=0),
        TopicKey("min.insync.replicas", _I, _A, broker_key="min.insync.replicas", minimum=1),
        # Levels of the codec a topic recompresses to (compression.type).
        *(
            TopicKey(name, _I, _A, broker_key=name, minimum=low, maximum=high)
            for name, low, high in (
                ("compression.gzip.level", -1, 9),
                ("compression.lz4.level", 1, 17),
                ("compression.zstd.level", -131072, 22),
            )
        ),
        TopicKey("cleanup.policy", _LIST, _A, broker_key="log.cleanup.policy", choices=("delete", "compact")),
        TopicKey("delete.retention.ms", _L, _A, broker_key="log.cleaner.delete.retention.ms", minimum=0),
        TopicKey("min.compaction.lag.ms", _L, _A, broker_key="log.cleaner.min.compaction.lag.ms", minimum=0),
        TopicKey(
            "min.cleanable.dirty.ratio",
            _D,
            _A,
            broker_key="log.cleaner.min.cleanable.ratio",
            minimum=0,
            maximum=1,
        ),
        TopicKey(
            "compression.type",
            _S,
            _A,
            broker_key="compression.type",
            choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
        ),
        TopicKey(
            "message.timestamp.type",
            _S,
            _O,
            "CreateTime",
            choices=("CreateTime", "LogAppendTime"),
            unsupported="this broker does not support LogAppendTime; it keeps the producer's timestamps",
        ),
        TopicKey(
            "message.timestamp.before.max.ms",
            _L,
            _O,
            LONG_MAX,
            minimum=0,
            unsupported="this broker does not check record timestamps",
        ),
        TopicKey(
            "message.timestamp.after.max.ms",
            _L,
            _O,
            LONG_MAX,
            minimum=0,
            unsupported="this broker does not check record timestamps",
        ),
        TopicKey(
            "flush.messages",
            _L,
            _O,
            LONG_MAX,
            minimum=1,
            unsupported="this broker flushes by time (flush.ms) and for acks=all, not by message count",
        ),
        TopicKey(
            "remote.storage.enable",
            _B,
            _O,
            "false",
            unsupported="this broker does not support tiered storage",
        ),
        # Accepted, with nothing a client of a single plain broker could observe.
        # The cleaner runs every log.cleaner.backoff.ms whatever the dirty ratio's age.
        TopicKey("max.compaction.lag.ms", _L, _N, LONG_MAX, minimum=1),
        TopicKey("file.delete.delay.ms", _L, _N, "60000", minimum=0),
        TopicKey("preallocate", _B, _N, "false"),
        TopicKey("segment.index.bytes", _I, _N, "10485760", minimum=4),
        TopicKey("unclean.leader.election.enable", _B, _N, "false"),
        TopicKey("leader.replication.throttled.replicas", _LIST, _N, ""),
        TopicKey("follower.replication.throttled.replicas", _LIST, _N, ""),
        TopicKey("local.retention.ms", _L, _N, "-2", minimum=-2),
        TopicKey("local.retention.bytes", _L, _N, "-2", minimum=-2),
        TopicKey("remote.log.copy.disable", _B, _N, "false"),
        TopicKey("remote.log.delete.on.disable", _B, _N, "false"),
    )
}


def validate_topic_configs(configs: Mapping[str, str]) -> None:
    """Raise InvalidConfigError for the first key that Kafka would not know, a value of the wrong
    type or range, or a value this broker would not apply."""
    for name, value in configs.items():
        key = TOPIC_KEYS.get(name)
        if key is None:
            raise InvalidConfigError(f"Unknown topic config name: {name}{did_you_mean(name, TOPIC_KEYS)}")
        problem = value_problem(key.type, value, key.minimum, key.maximum, key.choices)
        if problem is None and key.support is Support.ONLY_DEFAULT and value.strip() != key.default:
            problem = key.unsupported
        if problem is not None:
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: {problem}")
