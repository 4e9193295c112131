"""The znodes of a cluster and their JSON, with Kafka's ZooKeeper-era paths and field names.

Decoding raises ValueError on anything malformed, so a bad znode is reported, never trusted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
TOPIC_CONFIGS = "/config/topics"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
# A znode per topic to delete; the controller deletes the topic's znodes, then the marker.
DELETE_TOPICS = "/admin/delete_topics"

NO_LEADER = -1


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def topic_config_path(topic: str) -> str:
    return f"{TOPIC_CONFIGS}/{topic}"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


@dataclass(frozen=True)
class BrokerRegistration:
    """`host` and `port` are the inter-broker listener's; `endpoints` every listener's (by
    name), which clients on that listener are given."""

    broker_id: int
    host: str
    port: int
    endpoints: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A broker with one plaintext listener names it, as Kafka's registrations always do.
        if not self.endpoints:
            object.__setattr__(self, "endpoints", {"PLAINTEXT": (self.host, self.port)})

    def encode(self) -> bytes:
        endpoints = self.endpoints
        return _dump(
            {
                "version": 4,
                "host": self.host,
                "port": self.port,
                "endpoints": [f"{name}://{host}:{port}" for name, (host, port) in endpoints.items()],
                "jmx_port": -1,
                "timestamp": str(int(time.time() * 1000)),
            }
        )

    @classmethod
    def decode(cls, broker_id: int, data: bytes) -> BrokerRegistration:
        fields = _load(data)
        endpoints = {}
        listed = fields.get("endpoints", [])
        if not isinstance(listed, list):
            raise ValueError("endpoints: expected a list")
        for endpoint in listed:
            name, sep, address = str(endpoint).partition("://")
            host, colon, port = address.rpartition(":")
            if not sep or not colon or not port.isdigit():
                raise ValueError(f"endpoints: cannot read {endpoint!r}")
            endpoints[name] = (host, int(port))
        return cls(broker_id, _str(fields, "host"), _int(fields, "port"), endpoints)


@dataclass(frozen=True)
class PartitionState:
    """/brokers/topics/T/partitions/P/state: written only with a compare-and-set on its version."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def encode(self) -> bytes:
        return _dump(
            {
                "version": 1,
                "leader": self.leader,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
                "controller_epoch": self.controller_epoch,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> PartitionState:
        fields = _load(data)
        return cls(
            _int(fields, "leader"),
            _int(fields, "leader_epoch"),
            _ints(fields, "isr"),
            _int(fields, "controller_epoch"),
        )


@dataclass(frozen=True)
class TopicAssignment:
    """/brokers/topics/T: the topic's id and each partition's replicas, the first preferred."""

    topic_id: uuid.UUID
    replicas: tuple[tuple[int, ...], ...]

    def encode(self) -> bytes:
        return _dump(
            {
                "version": 3,
                "topic_id": str(self.topic_id),
                "partitions": {str(index): list(nodes) for index, nodes in enumerate(self.replicas)},
                "adding_replicas": {},
                "removing_replicas": {},
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> TopicAssignment:
        fields = _load(data)
        partitions = fields.get("partitions")
        if not isinstance(partitions, dict) or not partitions:
            raise ValueError("partitions: expected a non-empty object")
        try:
            topic_id = uuid.UUID(_str(fields, "topic_id"))
            indexes = sorted(int(index) for index in partitions)
        except ValueError as error:
            raise ValueError(f"bad topic assignment: {error}") from error
        if indexes != list(range(len(indexes))):
            raise ValueError(f"partitions must be 0..n-1, got {indexes}")
        return cls(topic_id, tuple(_ints(partitions, str(index)) for index in indexes))


def encode_controller(broker_id: int) -> bytes:
    return _dump({"version": 1, "brokerid": broker_id, "timestamp": str(int(time.time() * 1000))})


def decode_controller(data: bytes) -> int:
    return _int(_load(data), "brokerid")


def encode_producer_id_block(broker_id: int, first: int, last: int) -> bytes:
    """Kafka's ProducerIdBlockZNode: the last block handed out, both ends included."""
    return _dump({"version": 1, "broker": broker_id, "block_start": str(first), "block_end": str(last)})


def decode_producer_id_block_end(data: bytes) -> int:
    """The last id handed out so far."""
    try:
        return int(_str(_load(data), "block_end"))
    except ValueError as error:
        raise ValueError(f"bad producer id block: {error}") from error


def encode_topic_config(configs: Mapping[str, str]) -> bytes:
    return _dump({"version": 1, "config": dict(configs)})


def decode_topic_config(data: bytes) -> dict[str, str]:
    config = _load(data).get("config")
    if not isinstance(config, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in config.items()
    ):
        raise ValueError("config: expected an object of strings")
    return config


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _load(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not JSON: {error}") from error
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return value


def _int(fields: Mapping[str, Any], key: str) -> int:
    value = fields.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key}: expected an integer, got {value!r}")
    return value


def _str(fields: Mapping[str, Any], key: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


def _ints(fields: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = fields.get(key)
    if not isinstance(value, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    ):
        raise ValueError(f"{key}: expected a list of integers, got {value!r}")
    return tuple(value)
