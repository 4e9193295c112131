"""Options shared by the onceflow reader and writer, named as in Spark's Kafka source."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

KAFKA_PREFIX = "kafka."

# Offsets are {"topic": {"partition": offset}} with string partition keys: Spark compares
# offsets as JSON text, so the same offsets must always serialise the same way.
Offsets = dict[str, dict[str, int]]

# Defaults for the clients that tasks create, which start often: a slot's producer whenever its
# write task lands on another Python worker. librdkafka (2.10 on) drops its bootstrap connection
# once it learns the brokers and, with sparse connections, connects to a learned one only after a
# suppression interval or the next timer tick: a transactional producer's init took 57 ms at the
# median and 0.5 s in one of ten, against 5 ms (at most 10) connecting to every broker at once.
QUICK_START = {"enable.sparse.connections": False}


class OptionError(ValueError):
    """An option the user gave that cannot work; the message says which and why."""


def client_config(options: Mapping[str, str]) -> dict[str, Any]:
    """The `kafka.*` options, passed through to the client without their prefix."""
    config = {
        key[len(KAFKA_PREFIX) :]: value for key, value in options.items() if key.startswith(KAFKA_PREFIX)
    }
    if "bootstrap.servers" not in config:
        raise OptionError("option 'kafka.bootstrap.servers' is required")
    return config


def sorted_offsets(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    """The canonical form: topics sorted by name, partitions by number."""
    return {
        topic: {partition: offsets[topic][partition] for partition in sorted(offsets[topic], key=int)}
        for topic in sorted(offsets)
    }


def positive_int(options: Mapping[str, str], name: str) -> int | None:
    """Option `name` as a positive integer, or None when it is not given."""
    value = options.get(name)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise OptionError(f"option {name!r} must be a positive integer, not {value!r}")
    return int(value)


def parse_offsets_json(text: str, option: str) -> Offsets:
    """`{"topic": {"0": 23, "1": -2}}` as Spark's Kafka source takes it (-2 earliest, -1 latest)."""
    try:
        parsed = json.loads(text)
        return sorted_offsets(
            {str(topic): {str(int(p)): int(o) for p, o in parts.items()} for topic, parts in parsed.items()}
        )
    except (ValueError, AttributeError, TypeError) as error:
        raise OptionError(
            f"option {option!r} must be earliest, latest or JSON like "
            f'{{"topic": {{"0": 23}}}}, not {text!r} ({error})'
        ) from error


class Subscription:
    """Which topics a query reads: `subscribe` (comma-separated) or `subscribePattern` (a regex)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        names = options.get("subscribe")
        pattern = options.get("subscribePattern")
        if (names is None) == (pattern is None):
            raise OptionError("give exactly one of the options 'subscribe' and 'subscribePattern'")
        self.names = [name.strip() for name in names.split(",") if name.strip()] if names else []
        try:
            self.pattern = re.compile(pattern) if pattern is not None else None
        except re.error as error:
            raise OptionError(f"option 'subscribePattern' is not a valid regex: {error}") from error

    def partitions(self, admin: AdminClient, timeout_s: float) -> dict[str, int]:
        """Partition count of every subscribed topic that exists now."""
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException as error:
            raise OptionError(f"cannot list topics: {error}") from error
        counts = {}
        for name, topic in metadata.topics.items():
            wanted = name in self.names if self.pattern is None else self.pattern.fullmatch(name)
            if wanted and topic.error is None and topic.partitions:
                counts[name] = len(topic.partitions)
        return counts
