"""Config entries as DescribeConfigs (and CreateTopics v5+) report them: value, source, type and
synonyms, for a topic (its own configs over the broker's over Kafka's defaults) and for the broker."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

from onceflow.broker.config import DEFAULTS, BrokerConfig
from onceflow.log.config import LogConfig
from onceflow.log.topic_configs import TOPIC_KEYS, ConfigType, Support

# Kafka's config_source values.
TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# The LogConfig field behind each applied topic key, and every broker key that can set it.
_LOG_FIELDS = {
    "segment.bytes": ("segment_bytes", ("log.segment.bytes",)),
    "index.interval.bytes": ("index_interval_bytes", ("log.index.interval.bytes",)),
    "retention.ms": ("retention_ms", ("log.retention.ms", "log.retention.minutes", "log.retention.hours")),
    "retention.bytes": ("retention_bytes", ("log.retention.bytes",)),
    "max.message.bytes": ("max_message_bytes", ("message.max.bytes",)),
    "flush.ms": ("flush_interval_ms", ("log.flush.interval.ms",)),
    "cleanup.policy": ("cleanup_policy", ("log.cleanup.policy",)),
    "delete.retention.ms": ("delete_retention_ms", ("log.cleaner.delete.retention.ms",)),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", ("log.cleaner.min.compaction.lag.ms",)),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", ("log.cleaner.min.cleanable.ratio",)),
}

_KAFKA_LOG_DEFAULTS = LogConfig()
# Broker keys: DescribeConfigs' types, and the log keys the broker reports even when unset.
BROKER_LOG_DEFAULTS = {
    "log.segment.bytes": str(_KAFKA_LOG_DEFAULTS.segment_bytes),
    "log.index.interval.bytes": str(_KAFKA_LOG_DEFAULTS.index_interval_bytes),
    "log.retention.hours": str(_KAFKA_LOG_DEFAULTS.retention_ms // 3_600_000),
    "log.retention.bytes": str(_KAFKA_LOG_DEFAULTS.retention_bytes),
    "message.max.bytes": str(_KAFKA_LOG_DEFAULTS.max_message_bytes),
    "producer.id.expiration.ms": str(_KAFKA_LOG_DEFAULTS.producer_id_expiration_ms),
    "log.flush.interval.ms": str(_KAFKA_LOG_DEFAULTS.flush_interval_ms),
    "log.cleanup.policy": _KAFKA_LOG_DEFAULTS.cleanup_policy,
    "log.cleaner.delete.retention.ms": str(_KAFKA_LOG_DEFAULTS.delete_retention_ms),
    "log.cleaner.min.compaction.lag.ms": str(_KAFKA_LOG_DEFAULTS.min_compaction_lag_ms),
    "log.cleaner.min.cleanable.ratio": str(_KAFKA_LOG_DEFAULTS.min_cleanable_dirty_ratio),
}
_INT, _LONG, _BOOLEAN, _STRING = ConfigType.INT, ConfigType.LONG, ConfigType.BOOLEAN, ConfigType.STRING
BROKER_KEY_TYPES: dict[str, ConfigType] = {
    "num.partitions": _INT,
    "auto.create.topics.enable": _BOOLEAN,
    "min.insync.replicas": _INT,
    "socket.request.max.bytes": _INT,
    "fetch.max.bytes": _INT,
    "log.retention.check.interval.ms": _LONG,
    "producer.id.expiration.check.interval.ms": _INT,
    "producer.snapshot.interval.ms": _LONG,
    "transaction.max.timeout.ms": _INT,
    "transactional.id.expiration.ms": _INT,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": _INT,
    "group.initial.rebalance.delay.ms": _INT,
    "group.min.session.timeout.ms": _INT,
    "group.max.session.timeout.ms": _INT,
    "offset.metadata.max.bytes": _INT,
    "offsets.topic.num.partitions": _INT,
    "offsets.topic.replication.factor": ConfigType.SHORT,
    "offsets.commit.timeout.ms": _INT,
    "transaction.state.log.num.partitions": _INT,
    "transaction.state.log.replication.factor": ConfigType.SHORT,
    "transaction.state.log.min.isr": _INT,
    "cluster.id": _STRING,
    "node.id": _INT,
    "advertised.listeners": _STRING,
    "log.segment.bytes": _INT,
    "log.index.interval.bytes": _INT,
    "log.retention.hours": _INT,
    "log.retention.minutes": _INT,
    "log.retention.ms": _LONG,
    "log.retention.bytes": _LONG,
    "message.max.bytes": _INT,
    "producer.id.expiration.ms": _INT,
    "log.flush.interval.ms": _LONG,
    "log.cleanup.policy": ConfigType.LIST,
    "log.cleaner.delete.retention.ms": _LONG,
    "log.cleaner.min.compaction.lag.ms": _LONG,
    "log.cleaner.min.cleanable.ratio": ConfigType.DOUBLE,
    "log.cleaner.enable": _BOOLEAN,
    "log.cleaner.backoff.ms": _LONG,
    "offsets.topic.segment.bytes": _INT,
    "transaction.state.log.segment.bytes": _INT,
    "zookeeper.connect": _STRING,
    "zookeeper.session.timeout.ms": _INT,
    "zookeeper.connection.timeout.ms": _INT,
    "default.replication.factor": _INT,
    "unclean.leader.election.enable": _BOOLEAN,
    "replica.lag.time.max.ms": _LONG,
}


class Synonym(NamedTuple):
    name: str
    value: str
    source: int


class ConfigEntry(NamedTuple):
    name: str
    value: str
    source: int
    type: ConfigType
    # Every source of the value, the one in effect first (Kafka's order).
    synonyms: list[Synonym]


def topic_entries(
    config: BrokerConfig, topic_configs: Mapping[str, str], effective: LogConfig
) -> list[ConfigEntry]:
    """Every topic key this broker describes, with the value in effect for the topic."""
    applied = dataclasses.asdict(effective)
    entries = []
    for key in sorted(TOPIC_KEYS.values(), key=lambda key: key.name):
        if not key.described:
            continue
        synonyms = []
        stored = topic_configs.get(key.name)
        if stored is not None and (key.support is not Support.ONLY_DEFAULT or stored == key.default):
            synonyms.append(Synonym(key.name, stored, TOPIC_CONFIG))
        if key.name in _LOG_FIELDS:
            field, broker_keys = _LOG_FIELDS[key.name]
            synonyms += [
                Synonym(name, config.props[name], STATIC_BROKER_CONFIG)
                for name in broker_keys  # the one that wins first: ms, then minutes, then hours
                if name in config.props
            ]
            default_key = next(name for name in broker_keys if name in BROKER_LOG_DEFAULTS)
            synonyms.append(Synonym(default_key, BROKER_LOG_DEFAULTS[default_key], DEFAULT_CONFIG))
            value = str(applied[field])
        elif key.broker_key is not None:  # min.insync.replicas
            if key.broker_key in config.props:
                synonyms.append(Synonym(key.broker_key, config.props[key.broker_key], STATIC_BROKER_CONFIG))
            synonyms.append(Synonym(key.broker_key, DEFAULTS[key.broker_key], DEFAULT_CONFIG))
            value = synonyms[0].value
        else:
            synonyms.append(Synonym(key.name, key.default, DEFAULT_CONFIG))
            value = synonyms[0].value
        entries.append(ConfigEntry(key.name, value, synonyms[0].source, key.type, synonyms))
    return entries


def broker_entries(config: BrokerConfig) -> list[ConfigEntry]:
    """The broker's keys: those it reads, with their defaults, and any others it was given."""
    defaults = {**DEFAULTS, **BROKER_LOG_DEFAULTS}
    entries = []
    for name in sorted({*defaults, *config.props}):
        synonyms = []
        if name in config.props:
            synonyms.append(Synonym(name, config.props[name], STATIC_BROKER_CONFIG))
        if name in defaults:
            synonyms.append(Synonym(name, defaults[name], DEFAULT_CONFIG))
        value, source = synonyms[0].value, synonyms[0].source
        entries.append(
            ConfigEntry(name, value, source, BROKER_KEY_TYPES.get(name, ConfigType.UNKNOWN), synonyms)
        )
    return entries
