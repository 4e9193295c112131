"""A read task's own Kafka client for plain connections: read_committed Fetch requests over a
socket, and the records of the batches they bring walked straight into Arrow columns by
`onceflow._recordcolumns`, with no confluent-kafka Message per record.

Through confluent-kafka a record cost a read task about 1 us of CPU in the consumer (librdkafka's
parsing, then a Message with its key and value copied out) and 0.6-1 us more to build Arrow columns
from the Messages; here it costs a few nanoseconds in C on top of one copy of each answer. Spark's
own Kafka source reads in the JVM, where a consumer's records become rows with no process in
between; a Python data source's task pays for every record in Python first.

It reads a task's ranges as Kafka's Java consumer reads for read_committed (KIP-98): every
partition of a leader in one Fetch, the aborted transactions an answer lists skipped by producer
id from their first offset to their ABORT marker, control batches skipped, compressed batches
inflated (`onceflow.records.decompress`), records before a range's start or at its end left out, a
partition that moved (NOT_LEADER_OR_FOLLOWER and the like) or a lost connection found again through
a new Metadata request, an offset past the log's start read from the earliest one, as the
confluent-kafka path's `auto.offset.reset=earliest` does. A batch of the message formats before v2
(Kafka before 0.11) ends the fast path for its range; the caller reads the rest through
confluent-kafka. TLS, SASL and every librdkafka setting stay with confluent-kafka too:
`plain_enough` decides which path a task takes.
"""

from __future__ import annotations

import importlib
import socket
import struct
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.protocol.build import build
from onceflow.protocol.codec import decode_response, encode_request, request_type
from onceflow.records import RecordFormatError, decompress
from onceflow.spark.rows import ROWS_PER_ARROW_BATCH
from onceflow.spark.task_times import StageClock

try:
    # By name: the import checker sees no module file for an extension, only its package.
    _recordcolumns: ModuleType | None = importlib.import_module("onceflow._recordcolumns")
except ImportError:  # built without a C compiler: every task reads through confluent-kafka
    _recordcolumns = None

FETCH, LIST_OFFSETS, METADATA = 1, 2, 3
FETCH_VERSION, LIST_OFFSETS_VERSION, METADATA_VERSION = 11, 5, 8
READ_COMMITTED = 1
EARLIEST_TIMESTAMP = -2
# Data below a range's end is there; only a partition whose leader is behind the one that planned
# the range (its last stable offset short of the end) waits, up to this long per fetch.
FETCH_MAX_WAIT_MS = 50
FETCH_MAX_BYTES = 16 * 1024 * 1024
PARTITION_MAX_BYTES = 4 * 1024 * 1024
# A range's first fetch, before its records' size is known; later ones ask for what is left.
FIRST_PARTITION_BYTES = 1024 * 1024
MIN_PARTITION_BYTES = 16 * 1024
REQUEST_TIMEOUT_S = 30.0
RETRY_AFTER_S = 0.05
# A Kafka answer this big is not one to a request of these sizes.
MAX_ANSWER_BYTES = 256 * 1024 * 1024
PLAIN_SETTINGS = frozenset({"bootstrap.servers", "client.id", "group.id", "security.protocol"})

# Kafka's v2 record batch header (DefaultRecordBatch): base offset, length, partition leader
# epoch, magic, CRC, attributes, last offset delta, base and max timestamps, producer id and
# epoch, base sequence, record count.
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOG_OVERHEAD = 12  # the base offset and the length before the length's count starts
_COMPRESSION, _LOG_APPEND_TIME, _TRANSACTIONAL, _CONTROL = 0x07, 0x08, 0x10, 0x20
_ABORT = 0
_CONTROL_KEY = struct.Struct(">hh")  # a control record's key: version, type
_INT32 = struct.Struct(">i")
# Errors after which the partition's leader is looked up again.
_MOVED = {
    ErrorCode.not_leader_or_follower,
    ErrorCode.unknown_topic_or_partition,
    ErrorCode.leader_not_available,
    ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch,
    ErrorCode.kafka_storage_error,
    ErrorCode.replica_not_available,
    ErrorCode.offset_not_available,
    ErrorCode.request_timed_out,
    ErrorCode.network_exception,
}


class FetchError(RuntimeError):
    """The broker answered a read with an error a retry does not cure."""


def plain_enough(config: Mapping[str, Any]) -> bool:
    """Whether a task with this client config reads here: the reader is compiled, and the config
    holds nothing but a plaintext connection's bootstrap servers and names."""
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    return _recordcolumns is not None and protocol == "plaintext" and set(config) <= PLAIN_SETTINGS


class Connection:
    """A blocking connection to one broker, one request at a time."""

    def __init__(self, address: tuple[str, int], client_id: str) -> None:
        self.client_id = client_id
        self._socket = socket.create_connection(address, timeout=REQUEST_TIMEOUT_S)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._correlation_id = 0
        self._buffer = bytearray(64 * 1024)  # grows to the largest answer so far

    def exchange(self, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        self._correlation_id += 1
        body = build(request_type(api_key, version), fields)
        header = build(
            body.__header_schema__,
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=self._correlation_id,
            client_id=self.client_id,
        )
        self._socket.sendall(encode_request(header, body))
        (size,) = _INT32.unpack(self._read(_INT32.size))
        if not _INT32.size <= size <= MAX_ANSWER_BYTES:
            raise ConnectionError(f"an answer of {size} bytes")
        with self._read(size).toreadonly() as frame:
            answered, response = decode_response(api_key, version, frame)
        if answered != self._correlation_id:
            raise ConnectionError(f"answer {answered} to request {self._correlation_id}")
        return response

    def _read(self, size: int) -> memoryview:
        if len(self._buffer) < size:
            self._buffer = bytearray(size)
        view = memoryview(self._buffer)[:size]
        filled = 0
        while filled < size:
            got = self._socket.recv_into(view[filled:])
            if not got:
                raise ConnectionError("the broker closed the connection")
            filled += got
        return view

    def close(self) -> None:
        self._socket.close()


@dataclass
class RangeRead:
    """One range of a task, as far as it got."""

    topic: str
    partition: int
    end: int
    position: int
    columns: Any  # onceflow._recordcolumns.Columns (see its .pyi)
    bytes_per_offset: float = 0.0  # what the range's records took so far, to size its fetches
    at_least: int = 0  # the size of a batch that did not fit the last fetch
    legacy: bool = False  # a batch of an old message format: confluent-kafka reads the rest

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition

    @property
    def done(self) -> bool:
        return self.position >= self.end or self.legacy

    def fetch_bytes(self) -> int:
        if not self.bytes_per_offset:
            wanted = FIRST_PARTITION_BYTES
        else:
            wanted = int((self.end - self.position) * self.bytes_per_offset * 1.25)
        return max(MIN_PARTITION_BYTES, self.at_least, min(PARTITION_MAX_BYTES, wanted))


class Fetcher:
    """Connections to the brokers a worker's read tasks fetch from, and where partitions lead,
    kept from task to task."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.client_id = str(config.get("client.id", "onceflow-spark-reader"))
        self.bootstrap = [
            _address(server) for server in str(config["bootstrap.servers"]).split(",") if server
        ]
        self._brokers: dict[int, tuple[str, int]] = {}
        self._connections: dict[int, Connection] = {}
        self._leaders: dict[tuple[str, int], int] = {}

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    def read(
        self,
        ranges: Sequence[tuple[str, int, int, int]],
        stall_timeout_s: float,
        clock: StageClock,
    ) -> Generator[tuple[str, int, tuple[Any, ...]], None, list[tuple[str, int, int, int]]]:
        """The committed records of each (topic, partition, start, end), as (topic, partition,
        `Columns.take()`) at most about ROWS_PER_ARROW_BATCH rows at a time; the ranges left to
        confluent-kafka (an old message format) are returned as (topic, partition, position, end)."""
        assert _recordcolumns is not None
        reads = {
            (topic, partition): RangeRead(topic, partition, end, start, _recordcolumns.Columns())
            for topic, partition, start, end in ranges
        }
        last_progress = time.monotonic()
        while unfinished := [read for read in reads.values() if not read.done]:
            progressed = False
            for leader, reading in self._by_leader(unfinished, clock).items():
                try:
                    with clock.stage("fetch"):
                        answer = self._fetch(leader, reading)
                except (OSError, ConnectionError):
                    self._forget(leader)
                    continue
                by_key = {read.key: read for read in reading}
                for topic in answer.responses:
                    for fetched in topic.partitions:
                        answered = by_key.get((topic.topic, fetched.partition_index))
                        if answered is not None:
                            with clock.stage("arrow"):
                                progressed |= self._take(answered, fetched)
            for read in reads.values():
                if read.columns.rows >= ROWS_PER_ARROW_BATCH or (read.done and read.columns.rows):
                    with clock.stage("arrow"):
                        taken = read.columns.take()
                    yield read.topic, read.partition, taken
            if progressed:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout_s:
                stuck = ", ".join(f"{read.topic}-{read.partition} at {read.position}" for read in unfinished)
                raise TimeoutError(f"no progress reading {stuck} for {stall_timeout_s:.0f} s")
            else:
                time.sleep(RETRY_AFTER_S)  # a leader moved or a broker was unreachable
        return [
            (read.topic, read.partition, read.position, read.end) for read in reads.values() if read.legacy
        ]

    def _fetch(self, leader: int, reading: list[RangeRead]) -> Any:
        topics: dict[str, list[dict[str, Any]]] = {}
        for read in reading:
            topics.setdefault(read.topic, []).append(
                {
                    "partition": read.partition,
                    "current_leader_epoch": -1,
                    "fetch_offset": read.position,
                    "log_start_offset": -1,
                    "partition_max_bytes": read.fetch_bytes(),
                }
            )
        answer = self._connection(leader).exchange(
            FETCH,
            FETCH_VERSION,
            {
                "replica_id": -1,
                "max_wait": FETCH_MAX_WAIT_MS,
                "min_bytes": 1,
                "max_bytes": FETCH_MAX_BYTES,
                "isolation_level": READ_COMMITTED,
                "session_id": 0,
                "session_epoch": -1,  # no fetch session: every fetch names its partitions
                "topics": [
                    {"topic": topic, "partitions": partitions} for topic, partitions in topics.items()
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            },
        )
        if answer.error_code != ErrorCode.none:
            raise ConnectionError(f"the fetch failed: {answer.error_code.name}")
        return answer

    def _take(self, read: RangeRead, fetched: Any) -> bool:
        """One partition's part of an answer; whether its range moved on."""
        error = fetched.error_code
        if error == ErrorCode.offset_out_of_range:
            return self._reset_to_earliest(read)
        if error in _MOVED:
            self._leaders.pop(read.key, None)
            return False
        if error != ErrorCode.none:
            raise FetchError(f"reading {read.topic}-{read.partition} at {read.position}: {error.name}")
        records = fetched.records or b""
        before = read.position
        aborted = sorted(fetched.aborted_transactions or (), key=lambda entry: int(entry.first_offset))
        aborting: set[int] = set()
        position = 0
        with memoryview(records) as view:
            while position + _BATCH_HEADER.size <= len(view):
                (
                    base_offset,
                    length,
                    _,
                    magic,
                    _,
                    attributes,
                    last_delta,
                    base_timestamp,
                    max_timestamp,
                    producer_id,
                    _,
                    _,
                    count,
                ) = _BATCH_HEADER.unpack_from(view, position)
                batch_end = position + _LOG_OVERHEAD + length
                if batch_end > len(view):
                    # Cut off by the fetch's byte limit: the next fetch starts there, big enough.
                    read.at_least = _LOG_OVERHEAD + length
                    break
                if magic != 2:
                    read.legacy = True
                    break
                last_offset = base_offset + last_delta
                if last_offset >= read.position:
                    while aborted and int(aborted[0].first_offset) <= last_offset:
                        aborting.add(int(aborted.pop(0).producer_id))
                    records_at = position + _BATCH_HEADER.size
                    if attributes & _CONTROL:
                        if producer_id in aborting and _control_type(view, records_at) == _ABORT:
                            aborting.discard(producer_id)
                    elif not (attributes & _TRANSACTIONAL and producer_id in aborting):
                        section = view[records_at:batch_end]
                        codec = attributes & _COMPRESSION
                        try:
                            read.columns.add(
                                decompress(codec, section) if codec else section,
                                count,
                                base_offset,
                                base_timestamp,
                                bool(attributes & _LOG_APPEND_TIME),
                                max_timestamp,
                                read.position,
                                read.end,
                            )
                        except ValueError as damaged:  # RecordFormatError included
                            where = f"{read.topic}-{read.partition}"
                            raise FetchError(
                                f"a damaged batch at {base_offset} in {where}: {damaged}"
                            ) from None
                    read.position = last_offset + 1
                position = batch_end
        if read.position > before:
            read.bytes_per_offset = position / (read.position - before)
            read.at_least = 0
            return True
        return False

    def _reset_to_earliest(self, read: RangeRead) -> bool:
        """The range starts before the log does (retention, DeleteRecords): read from its start."""
        leader = self._leaders.get(read.key)
        if leader is None:
            return False
        answer = self._connection(leader).exchange(
            LIST_OFFSETS,
            LIST_OFFSETS_VERSION,
            {
                "replica_id": -1,
                "isolation_level": READ_COMMITTED,
                "topics": [
                    {
                        "name": read.topic,
                        "partitions": [
                            {
                                "partition_index": read.partition,
                                "current_leader_epoch": -1,
                                "timestamp": EARLIEST_TIMESTAMP,
                            }
                        ],
                    }
                ],
            },
        )
        for topic in answer.topics:
            for found in topic.partitions:
                if found.error_code == ErrorCode.none and int(found.offset) > read.position:
                    read.position = int(found.offset)
                    return True
        self._leaders.pop(read.key, None)
        return False

    def _by_leader(self, reads: list[RangeRead], clock: StageClock) -> dict[int, list[RangeRead]]:
        if any(read.key not in self._leaders for read in reads):
            with clock.stage("fetch"):
                self._look_up_leaders({read.topic for read in reads})
        by_leader: dict[int, list[RangeRead]] = {}
        for read in reads:
            leader = self._leaders.get(read.key)
            if leader is not None:
                by_leader.setdefault(leader, []).append(read)
        return by_leader

    def _look_up_leaders(self, topics: set[str]) -> None:
        """Where each partition of `topics` leads, from any broker that answers."""
        known = list(self._connections)
        candidates: list[int | tuple[str, int]] = [*known, *self.bootstrap]
        for candidate in candidates:
            try:
                if isinstance(candidate, int):
                    connection = self._connection(candidate)
                else:
                    connection = Connection(candidate, self.client_id)
                try:
                    answer = connection.exchange(
                        METADATA,
                        METADATA_VERSION,
                        {
                            "topics": [{"name": topic} for topic in sorted(topics)],
                            "allow_auto_topic_creation": False,
                            "include_cluster_authorized_operations": False,
                            "include_topic_authorized_operations": False,
                        },
                    )
                finally:
                    if not isinstance(candidate, int):
                        connection.close()
            except (OSError, ConnectionError):
                if isinstance(candidate, int):
                    self._forget(candidate)
                continue
            self._brokers = {broker.node_id: (broker.host, broker.port) for broker in answer.brokers}
            for topic in answer.topics:
                for partition in topic.partitions:
                    if partition.error_code == ErrorCode.none and partition.leader_id >= 0:
                        self._leaders[topic.name, partition.partition_index] = int(partition.leader_id)
            return

    def _connection(self, node_id: int) -> Connection:
        connection = self._connections.get(node_id)
        if connection is None:
            address = self._brokers.get(node_id)
            if address is None:
                raise ConnectionError(f"no address for broker {node_id}")
            connection = self._connections[node_id] = Connection(address, self.client_id)
        return connection

    def _forget(self, node_id: int) -> None:
        connection = self._connections.pop(node_id, None)
        if connection is not None:
            connection.close()
        for key in [key for key, leader in self._leaders.items() if leader == node_id]:
            del self._leaders[key]


def _control_type(view: memoryview, records_at: int) -> int:
    """The type of a control batch's record (0 ABORT, 1 COMMIT), from its key: past the record's
    length, attributes, timestamp delta, offset delta and key length."""
    position = _skip_varint(view, records_at) + 1
    for _ in range(3):
        position = _skip_varint(view, position)
    if position + _CONTROL_KEY.size > len(view):
        raise RecordFormatError("a control record without its key")
    return int(_CONTROL_KEY.unpack_from(view, position)[1])


def _skip_varint(view: memoryview, position: int) -> int:
    for index in range(position, min(position + 10, len(view))):
        if not view[index] & 0x80:
            return index + 1
    raise RecordFormatError("a control record's varint runs off its batch")


def _address(server: str) -> tuple[str, int]:
    host, _, port = server.strip().rpartition(":")
    return host.strip("[]"), int(port)
