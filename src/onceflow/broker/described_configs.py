"""Config entries as DescribeConfigs (and CreateTopics v5+) report them: value, source, type and
synonyms, for a topic (its own configs over the broker's over Kafka's defaults) and for the broker."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

from onceflow.broker.config import DEFAULTS, BrokerConfig
from onceflow.broker.config_keys import broker_key
from onceflow.log.config import LogConfig
from onceflow.log.config_checks import ConfigType
from onceflow.log.topic_configs import TOPIC_KEYS, Support

# Kafka's config_source values.
TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# The LogConfig field behind each applied topic key, and every broker key that can set it.
_LOG_FIELDS = {
    "segment.bytes": ("segment_bytes", ("log.segment.bytes",)),
    "index.interval.bytes": ("index_interval_bytes", ("log.index.interval.bytes",)),
    "segment.ms": ("segment_ms", ("log.roll.ms", "log.roll.hours")),
    "segment.jitter.ms": ("segment_jitter_ms", ("log.roll.jitter.ms", "log.roll.jitter.hours")),
    "retention.ms": ("retention_ms", ("log.retention.ms", "log.retention.minutes", "log.retention.hours")),
    "retention.bytes": ("retention_bytes", ("log.retention.bytes",)),
    "max.message.bytes": ("max_message_bytes", ("message.max.bytes",)),
    "flush.ms": ("flush_interval_ms", ("log.flush.interval.ms",)),
    "cleanup.policy": ("cleanup_policy", ("log.cleanup.policy",)),
    "delete.retention.ms": ("delete_retention_ms", ("log.cleaner.delete.retention.ms",)),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", ("log.cleaner.min.compaction.lag.ms",)),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", ("log.cleaner.min.cleanable.ratio",)),
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
            default_key = next(name for name in broker_keys if name in DEFAULTS)
            synonyms.append(Synonym(default_key, DEFAULTS[default_key], DEFAULT_CONFIG))
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
    defaults = DEFAULTS
    entries = []
    for name in sorted({*defaults, *config.props}):
        synonyms = []
        if name in config.props:
            synonyms.append(Synonym(name, config.props[name], STATIC_BROKER_CONFIG))
        if name in defaults:
            synonyms.append(Synonym(name, defaults[name], DEFAULT_CONFIG))
        value, source = synonyms[0].value, synonyms[0].source
        key = broker_key(name)
        assert key is not None  # the config was validated
        entries.append(ConfigEntry(name, value, source, key.type, synonyms))
    return entries
