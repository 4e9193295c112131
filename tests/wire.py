"""A raw Kafka wire client for tests that must send exact bytes.

Requests are given as plain values (dicts for nested entities), turned into
kio entities and encoded with kio's writers; the broker's own codec is not
used here, so a bug in it cannot hide itself.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import socket
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i64

from onceflow.protocol.build import build

_INT32 = struct.Struct(">i")


def make_batch(
    values: list[bytes],
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    records = tuple(
        Record(attributes=i8(0), timestamp=now, offset=i64(index), key=None, value=value, headers=())
        for index, value in enumerate(values)
    )
    buffer = io.BytesIO()
    write_new_batch(
        buffer,
        NewRecordBatch(
            producer_id=i64(producer_id),
            producer_epoch=i16(producer_epoch),
            base_sequence=i32(base_sequence),
            records=records,
            attributes=i16(16 if transactional else 0),
        ),
    )
    return buffer.getvalue()


class WireClient:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def frame(self, api_key: int, version: int, **fields: Any) -> tuple[int, bytes]:
        """Encode a request frame (with length prefix); returns (correlation id, bytes)."""
        request_class = load_request_schema(api_key, version)
        header_class = request_class.__header_schema__
        self._correlation_id += 1
        buffer = io.BytesIO()
        header_fields = {
            "request_api_key": i16(api_key),
            "request_api_version": i16(version),
            "correlation_id": i32(self._correlation_id),
        }
        if "client_id" in {field.name for field in dataclasses.fields(header_class)}:
            header_fields["client_id"] = "wire-test"
        entity_writer(header_class)(buffer, header_class(**header_fields))
        entity_writer(request_class)(buffer, build(request_class, fields))
        body = buffer.getvalue()
        return self._correlation_id, _INT32.pack(len(body)) + body

    def list_offset(self, topic: str, partition: int, timestamp: int = -1, isolation_level: int = 0) -> int:
        response = self.request(
            2,
            7,
            replica_id=-1,
            isolation_level=isolation_level,
            topics=[{"name": topic, "partitions": [{"partition_index": partition, "timestamp": timestamp}]}],
        )
        return int(response.topics[0].partitions[0].offset)

    def fetch(self, partitions: dict[Any, list[int]], version: int = 12, **options: Any) -> Any:
        """A Fetch, answered at once by default; `partitions` maps topics (ids from v13) to
        partitions; `options` as `fetch_fields` takes them."""
        return self.request(1, version, **fetch_fields(partitions, version, **options))

    def fetch_frame(self, partitions: dict[Any, list[int]], version: int = 12, **options: Any) -> bytes:
        """The frame of that Fetch, to send without waiting for its answer."""
        return self.frame(1, version, **fetch_fields(partitions, version, **options))[1]

    def init_producer_id(self, transactional_id: str | None = None) -> Any:
        return self.request(
            22,
            4,
            transactional_id=transactional_id,
            transaction_timeout=60_000,
            producer_id=-1,
            producer_epoch=-1,
        )

    def create_topic(self, name: str, partitions: int) -> Any:
        response = self.request(
            19,
            7,
            topics=[
                {
                    "name": name,
                    "num_partitions": partitions,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            timeout=10_000,
        )
        return response.topics[0].error_code

    def read_response(self, api_key: int, version: int, correlation_id: int) -> Any:
        size = _INT32.unpack(self._recv_exactly(4))[0]
        payload = self._recv_exactly(size)
        response_class = load_response_schema(api_key, version)
        header, offset = entity_reader(response_class.__header_schema__)(payload, 0)
        assert header.correlation_id == correlation_id, (header, correlation_id)
        response, _ = entity_reader(response_class)(payload, offset)
        return response

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        correlation_id, frame = self.frame(api_key, version, **fields)
        self.sock.sendall(frame)
        return self.read_response(api_key, version, correlation_id)

    def connection_closed(self) -> bool:
        """True once the broker has closed this connection."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, TimeoutError):
            return True

    def _recv_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self.sock.recv(size - len(chunks))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            chunks += chunk
        return bytes(chunks)


def produce(
    client: WireClient,
    topic: str,
    partition: int,
    records: bytes,
    acks: int = -1,
    version: int = 9,
    transactional_id: str | None = None,
) -> Any:
    """One Produce request for one partition; returns that partition's response."""
    response = client.request(
        0,
        version,
        transactional_id=transactional_id,
        acks=acks,
        timeout=10_000,
        topic_data=[{"name": topic, "partition_data": [{"index": partition, "records": records}]}],
    )
    return response.responses[0].partition_responses[0]


def fetch_fields(
    partitions: dict[Any, list[int]],
    version: int,
    fetch_offset: int = 0,
    isolation_level: int = 0,
    replica_state: dict[str, Any] | None = None,
    max_wait: int = 0,
    min_bytes: int = 0,
    max_bytes: int = 1 << 20,
    **partition_fields: Any,
) -> dict[str, Any]:
    """A consumer's Fetch of `partitions` from `fetch_offset`, with sessions declined."""
    topic_key = "topic_id" if version >= 13 else "topic"
    return {
        "replica_id": -1,
        "replica_state": replica_state or {},
        "max_wait": max_wait,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": isolation_level,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                topic_key: topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": fetch_offset,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                        **partition_fields,
                    }
                    for partition in numbers
                ],
            }
            for topic, numbers in partitions.items()
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
