"""A small synchronous Kafka wire client for the APIs confluent-kafka's AdminClient lacks.

confluent-kafka has no binding for ListTransactions (66), DescribeTransactions (65),
DescribeProducers (61) or OffsetDelete (47), so the tools speak them directly: kio encodes the
requests and decodes the responses. Each connection asks ApiVersions first and uses the
newest version both sides know, so the same code talks to onceflow and to Apache Kafka.
Requests go where Kafka wants them: DescribeProducers to the partition leader,
DescribeTransactions to the transaction coordinator, OffsetDelete to the group coordinator,
ListTransactions to every broker.
"""

from __future__ import annotations

import datetime
import io
import socket
import ssl
import struct
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from onceflow.admin.errors import AdminError, UsageError
from onceflow.admin.login import PLAINTEXT, ClientLogin, client_login
from onceflow.admin.schema import DescribeTransactionsResponseV0
from onceflow.protocol.build import build
from onceflow.security.sasl_errors import AuthenticationFailed
from onceflow.security.scram import ScramClient

_INT32 = struct.Struct(">i")
_CLIENT_ID = "onceflow-admin"
_GROUP_COORDINATOR, _TRANSACTION_COORDINATOR = 0, 1  # FindCoordinator key types
# Coordinator errors that clear up by themselves, e.g. while Kafka creates __transaction_state.
_RETRIABLE = {
    ErrorCode.coordinator_not_available,
    ErrorCode.coordinator_load_in_progress,
    ErrorCode.not_coordinator,
}


@dataclass(frozen=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int


API_VERSIONS = Api(18, "ApiVersions", 0, 0)
SASL_HANDSHAKE = Api(17, "SaslHandshake", 1, 1)
SASL_AUTHENTICATE = Api(36, "SaslAuthenticate", 0, 1)
# Metadata v0-3 are gone from Kafka 4; v4 is the oldest every supported broker still has.
METADATA = Api(3, "Metadata", 4, 12)
# v4 changed FindCoordinator to batches; v1-3 all look the same.
FIND_COORDINATOR = Api(10, "FindCoordinator", 1, 3)
OFFSET_DELETE = Api(47, "OffsetDelete", 0, 0)
DESCRIBE_PRODUCERS = Api(61, "DescribeProducers", 0, 0)
DESCRIBE_TRANSACTIONS = Api(65, "DescribeTransactions", 0, 0)
LIST_TRANSACTIONS = Api(66, "ListTransactions", 0, 1)

_RESPONSE_CLASSES: dict[tuple[int, int], type[Any]] = {
    (DESCRIBE_TRANSACTIONS.key, 0): DescribeTransactionsResponseV0,
}


@dataclass(frozen=True)
class TopicPartitionLeader:
    topic: str
    partition: int
    leader: int
    internal: bool


@dataclass(frozen=True)
class PartitionMetadata:
    """A partition as Metadata describes it: its leader (-1 while it has none: offline, or
    elected a moment ago), the leader's epoch, its replicas, ISR and replicas on dead brokers."""

    topic: str
    topic_id: uuid.UUID | None
    internal: bool
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]


@dataclass(frozen=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True)
class TransactionDescription:
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int  # -1 when no transaction is open
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ProducerState:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int  # -1 when the producer has no open transaction here


def parse_address(address: str) -> tuple[str, int]:
    host, separator, port = address.strip().rpartition(":")
    if not separator or not host or not port.isdigit():
        raise UsageError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def check_reachable(bootstrap: str, timeout_s: float) -> None:
    """Raises AdminError unless one of the comma-separated addresses takes a TCP connection:
    librdkafka only says "timed out" about a broker it cannot reach, a plain connect says why."""
    reasons = []
    for address in bootstrap.split(","):
        try:
            socket.create_connection(parse_address(address), timeout=timeout_s).close()
            return
        except OSError as error:
            reasons.append(f"{address}: {error.strerror or error}")
    raise AdminError(f"cannot reach a broker at {'; '.join(reasons)}")


def error_name(code: ErrorCode) -> str:
    return code.name.upper()


class BrokerConnection:
    """One socket to one broker, over TLS and logged in with SASL as `login` says; requests
    are sent one at a time."""

    def __init__(self, address: str, timeout_s: float, login: ClientLogin = PLAINTEXT) -> None:
        self.address = address
        self._timeout_s = timeout_s
        host, port = parse_address(address)
        try:
            self._socket = socket.create_connection((host, port), timeout=timeout_s)
            if login.ssl_context is not None:
                self._socket = login.ssl_context.wrap_socket(self._socket, server_hostname=host)
        except ssl.SSLError as error:
            raise AdminError(f"TLS with the broker at {address} failed: {error.reason or error}") from error
        except OSError as error:
            raise AdminError(f"cannot reach a broker at {address}: {error.strerror or error}") from error
        self._correlation_id = 0
        try:
            versions = self._send(API_VERSIONS, API_VERSIONS.max_version, {})
            if login.mechanism is not None:
                self._log_in(login)
        except AdminError:
            self.close()
            raise
        if versions.error_code != ErrorCode.none:
            self.close()
            raise AdminError(f"{address} answered ApiVersions with {error_name(versions.error_code)}")
        self._versions = {
            int(api.api_key): (int(api.min_version), int(api.max_version)) for api in versions.api_keys
        }

    def close(self) -> None:
        self._socket.close()

    def _log_in(self, login: ClientLogin) -> None:
        """SaslHandshake v1, then SaslAuthenticate with the mechanism's messages (KIP-152)."""
        assert login.mechanism is not None
        handshake = self._send(SASL_HANDSHAKE, SASL_HANDSHAKE.max_version, {"mechanism": login.mechanism})
        if handshake.error_code != ErrorCode.none:
            raise AdminError(
                f"{self.address} does not take SASL {login.mechanism} "
                f"({error_name(handshake.error_code)}; it takes {', '.join(handshake.mechanisms) or 'none'})"
            )
        if login.mechanism == "PLAIN":
            self._authenticate(f"\0{login.username}\0{login.password}".encode())
            return
        scram = ScramClient(login.mechanism, login.username, login.password)
        server_first = self._authenticate(scram.first())
        try:
            scram.verify(self._authenticate(scram.final(server_first)))
        except AuthenticationFailed as error:
            raise AdminError(f"SASL authentication with {self.address} failed: {error}") from error

    def _authenticate(self, token: bytes) -> bytes:
        answer = self._send(SASL_AUTHENTICATE, SASL_AUTHENTICATE.max_version, {"auth_bytes": token})
        if answer.error_code != ErrorCode.none:
            why = answer.error_message or error_name(answer.error_code)
            raise AdminError(f"SASL authentication with {self.address} failed: {why}")
        return bytes(answer.auth_bytes)

    def call(self, api: Api, **fields: Any) -> Any:
        """Send one request at the newest version both sides know and return its response."""
        broker_min, broker_max = self._versions.get(api.key, (0, -1))
        version = min(api.max_version, broker_max)
        if version < max(api.min_version, broker_min):
            raise AdminError(
                f"the broker at {self.address} does not support {api.name} (API key {api.key}) "
                f"v{api.min_version}-{api.max_version}"
            )
        return self._send(api, version, fields)

    def _send(self, api: Api, version: int, fields: dict[str, Any]) -> Any:
        request_class = load_request_schema(api.key, version)
        header_class = request_class.__header_schema__
        self._correlation_id += 1
        buffer = io.BytesIO()
        header = {
            "request_api_key": api.key,
            "request_api_version": version,
            "correlation_id": self._correlation_id,
            "client_id": _CLIENT_ID,
        }
        entity_writer(header_class)(buffer, build(header_class, header))
        entity_writer(request_class)(buffer, build(request_class, fields))
        request = buffer.getvalue()
        try:
            self._socket.sendall(_INT32.pack(len(request)) + request)
            (size,) = _INT32.unpack(self._receive(4))
            payload = self._receive(size)
        except TimeoutError as error:
            raise AdminError(
                f"{self.address} did not answer {api.name} within {self._timeout_s:g} s"
            ) from error
        except OSError as error:
            raise AdminError(f"lost the connection to {self.address}: {error.strerror or error}") from error
        response_class = _RESPONSE_CLASSES.get((api.key, version)) or load_response_schema(api.key, version)
        header, offset = entity_reader(response_class.__header_schema__)(payload, 0)
        if header.correlation_id != self._correlation_id:
            raise AdminError(f"{self.address} answered out of order ({api.name})")
        response, _ = entity_reader(response_class)(payload, offset)
        return response

    def _receive(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._socket.recv(size - len(data))
            if not chunk:
                raise ConnectionError(0, "the broker closed the connection")
            data += chunk
        return bytes(data)


class Cluster:
    """Connections to the brokers of one cluster, opened as requests need them."""

    def __init__(self, bootstrap: str, timeout_s: float, properties: Mapping[str, str] | None = None) -> None:
        """`properties`: a --command-config file's, for TLS and SASL (`admin.login`)."""
        self._timeout_s = timeout_s
        self._login = client_login(properties)
        self._bootstrap = self._connect_any(bootstrap.split(","))
        self._addresses: dict[int, str] = {}
        self._connections: dict[int, BrokerConnection] = {}

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._bootstrap.close()
        for connection in self._connections.values():
            connection.close()

    def partitions(self, topics: Iterable[str] | None = None) -> list[TopicPartitionLeader]:
        """The partitions of `topics` (all topics when None) with their leaders."""
        return [
            TopicPartitionLeader(p.topic, p.partition, p.leader, p.internal) for p in self.describe(topics)
        ]

    def describe(self, topics: Iterable[str] | None = None) -> list[PartitionMetadata]:
        """The partitions of `topics` (all topics when None) as Metadata describes them."""
        names = None if topics is None else sorted(set(topics))
        response = self._bootstrap.call(
            METADATA,
            topics=None if names is None else [{"name": name, "topic_id": None} for name in names],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        for broker in response.brokers:
            self._addresses[int(broker.node_id)] = f"{broker.host}:{broker.port}"
        found = []
        for topic in response.topics:
            if topic.error_code == ErrorCode.unknown_topic_or_partition:
                raise AdminError(f"unknown topic {topic.name!r}")
            if topic.error_code != ErrorCode.none:
                raise AdminError(f"topic {topic.name!r}: {error_name(topic.error_code)}")
            internal = bool(topic.is_internal) or str(topic.name).startswith("__")
            found += [
                PartitionMetadata(
                    topic=str(topic.name),
                    topic_id=topic.topic_id,
                    internal=internal,
                    partition=int(p.partition_index),
                    leader=int(p.leader_id),
                    leader_epoch=int(p.leader_epoch),
                    replicas=tuple(int(node) for node in p.replica_nodes),
                    isr=tuple(int(node) for node in p.isr_nodes),
                    offline_replicas=tuple(int(node) for node in p.offline_replicas),
                )
                for p in topic.partitions
            ]
        return sorted(found, key=lambda p: (p.topic, p.partition))

    def list_transactions(
        self, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
    ) -> list[TransactionListing]:
        """Every broker coordinates some transactional ids, so ask them all."""
        if not self._addresses:
            self.partitions([])
        listings = []
        for node_id in sorted(self._addresses):
            response = self._broker(node_id).call(
                LIST_TRANSACTIONS, state_filters=list(states), producer_id_filters=list(producer_ids)
            )
            if response.error_code != ErrorCode.none:
                raise AdminError(f"ListTransactions on broker {node_id}: {error_name(response.error_code)}")
            if response.unknown_state_filters:
                raise UsageError(f"unknown transaction states: {', '.join(response.unknown_state_filters)}")
            listings += [
                TransactionListing(
                    str(state.transactional_id), int(state.producer_id), state.transaction_state
                )
                for state in response.transaction_states
            ]
        return sorted(listings, key=lambda listing: listing.transactional_id)

    def describe_transactions(self, transactional_ids: Iterable[str]) -> dict[str, TransactionDescription]:
        """The coordinators' view of each id; ids no coordinator knows are left out."""
        by_coordinator: dict[int, list[str]] = defaultdict(list)
        for transactional_id in sorted(set(transactional_ids)):
            by_coordinator[self._transaction_coordinator(transactional_id)].append(transactional_id)
        described = {}
        for node_id, ids in by_coordinator.items():
            response = self._broker(node_id).call(DESCRIBE_TRANSACTIONS, transactional_ids=ids)
            for state in response.transaction_states:
                if state.error_code == ErrorCode.transactional_id_not_found:
                    continue
                if state.error_code != ErrorCode.none:
                    raise AdminError(
                        f"transactional id {state.transactional_id!r}: {error_name(state.error_code)}"
                    )
                described[str(state.transactional_id)] = TransactionDescription(
                    transactional_id=str(state.transactional_id),
                    state=state.transaction_state,
                    producer_id=int(state.producer_id),
                    producer_epoch=int(state.producer_epoch),
                    timeout_ms=_milliseconds(state.transaction_timeout),
                    start_time_ms=_epoch_ms(state.transaction_start_time),
                    partitions=tuple(
                        (str(topic.topic), int(partition))
                        for topic in state.topics
                        for partition in topic.partitions
                    ),
                )
        return described

    def describe_producers(
        self, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], list[ProducerState]]:
        """The active producers of each partition, asked of the partition's leader."""
        wanted = sorted(set(partitions))
        leaders = {(p.topic, p.partition): p.leader for p in self.partitions({topic for topic, _ in wanted})}
        by_leader: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for topic, partition in wanted:
            if (topic, partition) not in leaders:
                raise AdminError(f"unknown partition {topic}-{partition}")
            by_leader[leaders[topic, partition]][topic].append(partition)
        producers: dict[tuple[str, int], list[ProducerState]] = {}
        for leader, topics in by_leader.items():
            response = self._broker(leader).call(
                DESCRIBE_PRODUCERS,
                topics=[{"name": topic, "partition_indexes": indexes} for topic, indexes in topics.items()],
            )
            for topic in response.topics:
                for partition in topic.partitions:
                    if partition.error_code != ErrorCode.none:
                        raise AdminError(
                            f"DescribeProducers {topic.name}-{partition.partition_index}: "
                            f"{error_name(partition.error_code)}"
                        )
                    producers[str(topic.name), int(partition.partition_index)] = [
                        ProducerState(
                            producer_id=int(state.producer_id),
                            producer_epoch=int(state.producer_epoch),
                            last_sequence=int(state.last_sequence),
                            last_timestamp_ms=int(state.last_timestamp),
                            coordinator_epoch=int(state.coordinator_epoch),
                            current_txn_start_offset=int(state.current_txn_start_offset),
                        )
                        for state in partition.active_producers
                    ]
        return producers

    def delete_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        """OffsetDelete: each partition's error; AdminError for the group's."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in partitions:
            by_topic[topic].append(partition)
        coordinator = self._broker(self._coordinator(group_id, _GROUP_COORDINATOR))
        response = coordinator.call(
            OFFSET_DELETE,
            group_id=group_id,
            topics=[
                {"name": topic, "partitions": [{"partition_index": p} for p in wanted]}
                for topic, wanted in by_topic.items()
            ],
        )
        if response.error_code != ErrorCode.none:
            raise AdminError(f"group {group_id!r}: {error_name(response.error_code)}")
        return {
            (topic.name, int(partition.partition_index)): partition.error_code
            for topic in response.topics
            for partition in topic.partitions
        }

    def _transaction_coordinator(self, transactional_id: str) -> int:
        return self._coordinator(transactional_id, _TRANSACTION_COORDINATOR)

    def _coordinator(self, key: str, key_type: int) -> int:
        deadline = time.monotonic() + self._timeout_s
        while True:
            response = self._bootstrap.call(FIND_COORDINATOR, key=key, key_type=key_type)
            if response.error_code == ErrorCode.none:
                self._addresses[int(response.node_id)] = f"{response.host}:{response.port}"
                return int(response.node_id)
            if response.error_code not in _RETRIABLE or time.monotonic() > deadline:
                raise AdminError(f"cannot find the coordinator of {key!r}: {error_name(response.error_code)}")
            time.sleep(0.2)

    def _broker(self, node_id: int) -> BrokerConnection:
        connection = self._connections.get(node_id)
        if connection is None:
            if node_id not in self._addresses:
                raise AdminError(f"broker {node_id} is not in the cluster metadata")
            connection = self._connections[node_id] = BrokerConnection(
                self._addresses[node_id], self._timeout_s, self._login
            )
        return connection

    def _connect_any(self, addresses: list[str]) -> BrokerConnection:
        failure: AdminError | None = None
        for address in addresses:
            try:
                return BrokerConnection(address, self._timeout_s, self._login)
            except UsageError:
                raise
            except AdminError as error:
                failure = error
        assert failure is not None
        raise failure


def _milliseconds(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


def _epoch_ms(value: datetime.datetime | None) -> int:
    return -1 if value is None else round(value.timestamp() * 1000)
