"""confluent-kafka's AdminClient, with its failures turned into one-line AdminErrors."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from onceflow.admin.client import check_reachable
from onceflow.admin.errors import AdminError

T = TypeVar("T")


def settings(bootstrap: str, properties: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Client settings shared by the tools' confluent-kafka clients: `properties` (a
    --command-config file's) over the tools' own, and --bootstrap over both, as Kafka's tools."""
    # librdkafka logs every failed connection attempt to stderr; the tools report errors themselves.
    return {"log_level": 0, **(properties or {}), "bootstrap.servers": bootstrap}


def connect(bootstrap: str, timeout_s: float, properties: Mapping[str, str] | None = None) -> AdminClient:
    check_reachable(bootstrap, timeout_s)
    try:
        return AdminClient(settings(bootstrap, properties))
    except KafkaException as error:  # a bad --command-config key or value
        raise AdminError(f"cannot configure the client: {kafka_error_text(error)}") from error


def kafka_error_text(error: KafkaException) -> str:
    detail = error.args[0] if error.args else error
    return detail.str() if isinstance(detail, KafkaError) else str(detail)


def wait(future: Future[T], action: str, timeout_s: float, topic: str | None = None) -> T:
    """The future's result; `topic` names the topic an UNKNOWN_TOPIC_OR_PART error is about."""
    try:
        return future.result(timeout=timeout_s)
    except KafkaException as error:
        detail = error.args[0] if error.args else None
        if topic and isinstance(detail, KafkaError) and detail.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise AdminError(f"unknown topic {topic!r}") from error
        raise AdminError(f"cannot {action}: {kafka_error_text(error)}") from error
    except TimeoutError as error:
        raise AdminError(f"cannot {action}: no answer within {timeout_s:g} s") from error


def partition_count(admin: AdminClient, topic: str, timeout_s: float) -> int:
    try:
        metadata = admin.list_topics(topic, timeout=timeout_s)
    except KafkaException as error:
        raise AdminError(f"cannot read the metadata of {topic!r}: {kafka_error_text(error)}") from error
    topic_metadata = metadata.topics[topic]
    if topic_metadata.error is not None:
        if topic_metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise AdminError(f"unknown topic {topic!r}")
        raise AdminError(f"topic {topic!r}: {topic_metadata.error.str()}")
    return len(topic_metadata.partitions)


# Where ListOffsets looks: the log start, the high watermark, or the LSO (latest under read_committed).
OffsetPosition = Literal["earliest", "latest", "stable"]
_SPECS: dict[OffsetPosition, tuple[Callable[[], OffsetSpec], IsolationLevel]] = {
    "earliest": (OffsetSpec.earliest, IsolationLevel.READ_UNCOMMITTED),
    "latest": (OffsetSpec.latest, IsolationLevel.READ_UNCOMMITTED),
    "stable": (OffsetSpec.latest, IsolationLevel.READ_COMMITTED),
}


def offsets(
    admin: AdminClient, partitions: Iterable[tuple[str, int]], position: OffsetPosition, timeout_s: float
) -> dict[tuple[str, int], int]:
    make_spec, isolation = _SPECS[position]
    wanted = {TopicPartition(topic, partition): make_spec() for topic, partition in sorted(set(partitions))}
    if not wanted:
        return {}
    futures = admin.list_offsets(wanted, isolation_level=isolation, request_timeout=timeout_s)
    return {
        (key.topic, key.partition): int(
            wait(future, f"list offsets of {key.topic}-{key.partition}", timeout_s).offset
        )
        for key, future in futures.items()
    }
