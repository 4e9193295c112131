"""A loopback TCP proxy between Kafka clients and a broker that injects faults.

It understands Kafka framing both ways, so a fault hits whole requests and responses.

- Lost acks: the request reaches the broker and is acted on, and then the response is thrown away
  and the client's connection reset. The client sees a lost ack and retries, which is fault (A) of
  the seed documents.
- Lost requests: a Produce request is thrown away before the broker sees it and the client's
  connection reset, as a network failure would. A fire-and-forget (acks=0) send fails silently;
  any other is retried.

A reset also destroys the answers to the requests still waiting on that connection: those that
answer writes count as lost acks too.
- Broker faults (`BROKER_FAULTS`): the proxy makes the broker misbehave, so that the lab can show
  its checker fails when it should (negative controls). Each is a protocol rewrite: the request is
  decoded with kio, changed and encoded again, and the correlation id is kept.
  - `serve-aborted`: Fetch requests asking for read_committed (isolation level 1) are sent as
    read_uncommitted (0), so the broker hands aborted records to read_committed readers.
  - `drop-acked-produce`: a Produce is answered with success (offset -1) and never forwarded: the
    broker loses acknowledged writes.
  - `duplicate-produce`: a forwarded Produce is sent a second time, its batches made
    non-idempotent (no producer id, epoch or sequence), so the broker cannot tell the copy from
    new data. Transactional batches cannot lose their producer id; requests with one are not copied.
    A copy counts (`duplicated_values`) once the broker's answer says it stored it: a connection
    the client leaves, or a fault resets, is closed towards the broker only when the copies sent
    on it are answered (or after `COPY_ANSWER_WAIT_S`), so no copy is stored uncounted.

Any broker: with `rewrite_addresses`, the proxy rewrites the broker addresses of Metadata and
FindCoordinator responses (decoded with kio, knowing each request's API and version by its
correlation id) to ports of its own, one per upstream broker, opened when a new address first
appears. Every connection of a client that bootstraps from the proxy then passes through it, so
the faults reach a cluster of any Kafka-compatible brokers without changing their config.

Every fault is bounded: the proxy stops at the end of its `with` block, and `max_faults` caps how
many responses it may destroy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import random
import socket
import struct
import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from onceflow.protocol.build import build
from onceflow.protocol.codec import (
    MalformedRequestError,
    UnknownApiError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    peek_request_prefix,
    response_type,
)
from onceflow.records import RecordFields, RecordFormatError, scan_records

_INT32 = struct.Struct(">i")
PRODUCE, FETCH, METADATA, OFFSET_COMMIT, FIND_COORDINATOR, END_TXN, TXN_OFFSET_COMMIT = 0, 1, 3, 8, 10, 26, 28
# Responses that name brokers: rewritten, with `rewrite_addresses`, to send clients through the proxy.
ADDRESS_APIS = frozenset({METADATA, FIND_COORDINATOR})
_PRODUCE_KEY = struct.pack(">h", PRODUCE)  # how a request frame starts
# Responses that acknowledge a write: destroying one after the broker acted is a lost ack.
WRITE_APIS = frozenset({PRODUCE, OFFSET_COMMIT, END_TXN, TXN_OFFSET_COMMIT})
BROKER_FAULTS = ("serve-aborted", "drop-acked-produce", "duplicate-produce")
READ_COMMITTED, READ_UNCOMMITTED = 1, 0
# How long a connection whose client is gone stays open towards the broker for its copies' answers.
COPY_ANSWER_WAIT_S = 30.0
# The proxy's own requests (copies whose answers nobody waits for) count down from here.
_OWN_CORRELATION_IDS = -1


@dataclass
class FaultPlan:
    drop_response_probability: float = 0.0
    # For the answers to writes (WRITE_APIS), when set: they are few among the Fetches and heartbeats.
    drop_write_response_probability: float | None = None
    drop_produce_request_probability: float = 0.0
    drop_next_produce_request: bool = False  # one more, whatever the probability
    drop_next_write_response: bool = False  # the next answer to a write, whatever the probability
    delay_response_s: float = 0.0
    max_faults: int = 1_000
    seed: int = 0
    broker_fault: str | None = None  # one of BROKER_FAULTS
    # The share of Produce requests that drop-acked-produce and duplicate-produce hit.
    broker_fault_probability: float = 0.1


@dataclass
class BrokerFaultCounts:
    """What the broker faults did, with the values of the records they dropped or copied (the copies
    the broker answered as stored)."""

    fetches_rewritten: int = 0
    produces_dropped: int = 0
    produces_duplicated: int = 0  # copies stored in every partition they wrote to
    dropped_values: list[str] = field(default_factory=list)
    duplicated_values: list[str] = field(default_factory=list)


@dataclass
class _Pending:
    """A request that gets an answer, in request order: from the broker, or made up by the proxy."""

    correlation_id: int
    api_key: int
    api_version: int
    forged: bytes | None = None  # the proxy's own answer, sent in turn
    swallow: bool = False  # the answer to the proxy's own copy: the client never asked
    copied: dict[tuple[Any, int], list[str]] | None = None  # a copy's values by (topic, partition)


class FaultProxy:
    """`with FaultProxy(FaultPlan(...)) as proxy: proxy.upstream = (host, port)`.

    `on_request`, when given, sees every request frame (without its length prefix) on its way to
    the broker: the fuzzer records real clients' requests with it. With `rewrite_addresses`, the
    brokers that Metadata and FindCoordinator name are reached through ports of the proxy too.
    """

    def __init__(
        self,
        plan: FaultPlan,
        upstream: tuple[str, int] | None = None,
        on_request: Callable[[bytes], None] | None = None,
        rewrite_addresses: bool = False,
    ) -> None:
        self.plan = plan
        self.upstream = upstream
        self.on_request = on_request
        self.rewrite_addresses = rewrite_addresses
        # The proxy's port for each upstream broker address, and client connections per port.
        self.broker_ports: dict[tuple[str, int], int] = {}
        self.connections_by_port: Counter[int] = Counter()
        self._servers: list[asyncio.Server] = []
        self.responses_dropped = 0
        self.requests_dropped = 0
        self.responses_forwarded = 0
        # Destroyed responses by API key; those of WRITE_APIS are lost acks.
        self.dropped_by_api: Counter[int] = Counter()
        self.broker_faults = BrokerFaultCounts()
        self._links: set[_Link] = set()
        self._random = random.Random(plan.seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._port = 0

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    @property
    def connections_open(self) -> int:
        """Client connections being forwarded, or closed and still waiting for their copies' answers."""
        return len(self._links)

    @property
    def copies_unanswered(self) -> int:
        """Copies (`duplicate-produce`) sent to the broker and not yet answered: not yet counted."""
        return sum(link.copies_unanswered for link in list(self._links))

    @property
    def acks_lost(self) -> int:
        """Responses to writes destroyed after the broker acted on them."""
        # A copy first: the proxy's thread may add a key while another thread asks.
        return sum(count for api_key, count in list(self.dropped_by_api.items()) if api_key in WRITE_APIS)

    def __enter__(self) -> FaultProxy:
        started: Future[None] = Future()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(started),), daemon=True)
        self._thread.start()
        started.result(timeout=10)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def _main(self, started: Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._port = await self._listen(None)
        started.set_result(None)
        await self._stop.wait()
        for server in self._servers:
            server.close()

    async def _listen(self, upstream: tuple[str, int] | None) -> int:
        """A new listening port that forwards to `upstream` (None: to `self.upstream`, the bootstrap)."""
        server = await asyncio.start_server(functools.partial(self._serve, upstream), "127.0.0.1", 0)
        self._servers.append(server)
        port: int = server.sockets[0].getsockname()[1]
        return port

    async def port_for(self, upstream: tuple[str, int]) -> int:
        """The proxy's port for one upstream broker, opened the first time the broker is named."""
        if upstream not in self.broker_ports:
            self.broker_ports[upstream] = await self._listen(upstream)
        return self.broker_ports[upstream]

    async def _serve(
        self,
        upstream: tuple[str, int] | None,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
    ) -> None:
        upstream = upstream or self.upstream
        if upstream is None:
            client_writer.close()
            return
        self.connections_by_port[client_writer.get_extra_info("sockname")[1]] += 1
        try:
            broker_reader, broker_writer = await asyncio.open_connection(*upstream)
        except OSError:
            client_writer.close()
            return
        link = _Link(self, client_writer, broker_writer)
        self._links.add(link)
        try:
            await self._forward(link, client_reader, broker_reader)
        finally:
            self._links.discard(link)

    async def _forward(
        self, link: _Link, client_reader: asyncio.StreamReader, broker_reader: asyncio.StreamReader
    ) -> None:
        """Requests one way and answers the other until either side ends, then the copies' answers."""
        requests = asyncio.create_task(link.requests(client_reader))
        responses = asyncio.create_task(link.responses(broker_reader))
        client_gone = asyncio.create_task(link.client_gone.wait())
        await asyncio.wait([requests, responses, client_gone], return_when=asyncio.FIRST_COMPLETED)
        requests.cancel()
        _reset(link.client)
        link.client_gone.set()
        if link.copies_unanswered and not responses.done():
            # The broker may store a copy whatever becomes of the connection: its answer says.
            await asyncio.wait([responses], timeout=COPY_ANSWER_WAIT_S)
        for task in (responses, client_gone):
            task.cancel()
        _reset(link.broker)

    def broker_fault_hits(self) -> bool:
        return self._random.random() < self.plan.broker_fault_probability

    def drops_produce_request(self) -> bool:
        if self.plan.drop_next_produce_request:
            self.plan.drop_next_produce_request = False
            return True
        return (
            self.requests_dropped < self.plan.max_faults
            and self._random.random() < self.plan.drop_produce_request_probability
        )

    async def rewritten(self, request: _Pending, frame: bytes) -> bytes:
        """A Metadata or FindCoordinator response (length prefix included) naming the proxy's ports
        instead of the brokers; as it came when it cannot be decoded."""
        try:
            _, body = decode_response(request.api_key, request.api_version, frame[4:])
        except (MalformedRequestError, UnknownApiError):
            return frame
        if request.api_key == METADATA:
            brokers = [await self._proxied(broker) for broker in body.brokers]
            body = dataclasses.replace(body, brokers=tuple(brokers))
        elif request.api_version >= 4:
            coordinators = [await self._proxied(coordinator) for coordinator in body.coordinators]
            body = dataclasses.replace(body, coordinators=tuple(coordinators))
        else:
            body = await self._proxied(body)
        return encode_response(request.correlation_id, body)

    async def _proxied(self, entity: Any) -> Any:
        """`entity` (a broker or coordinator) with its host and port replaced by the proxy's;
        unchanged when it names no broker (a coordinator not found has port -1)."""
        if entity.port <= 0 or not entity.host:
            return entity
        port = await self.port_for((entity.host, entity.port))
        return dataclasses.replace(entity, host="127.0.0.1", port=type(entity.port)(port))

    def drops_response(self, api_key: int) -> bool:
        if api_key in WRITE_APIS and self.plan.drop_next_write_response:
            self.plan.drop_next_write_response = False
            return True
        probability = self.plan.drop_response_probability
        if api_key in WRITE_APIS and self.plan.drop_write_response_probability is not None:
            probability = self.plan.drop_write_response_probability
        return self.responses_dropped < self.plan.max_faults and self._random.random() < probability


class _Link:
    """One client connection and its connection to the broker."""

    def __init__(self, proxy: FaultProxy, client: asyncio.StreamWriter, broker: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = client
        self.broker = broker
        self.pending: deque[_Pending] = deque()
        self.own_correlation_id = _OWN_CORRELATION_IDS
        self.copies_unanswered = 0
        # Set when the client's side ends (it left, or a fault resets it): answers go nowhere then.
        self.client_gone = asyncio.Event()

    async def requests(self, reader: asyncio.StreamReader) -> None:
        while True:
            prefix = await reader.readexactly(4)
            frame = await reader.readexactly(_INT32.unpack(prefix)[0])
            if self.proxy.on_request is not None:
                self.proxy.on_request(frame)
            if frame[:2] == _PRODUCE_KEY and self.proxy.drops_produce_request():
                self.proxy.requests_dropped += 1
                self._count_reset_losses()
                return  # the caller resets both connections: the request is lost on the way
            for outgoing in self._handle(frame):
                self.broker.write(outgoing)
            self._send_forged()
            await self.broker.drain()

    def _handle(self, frame: bytes) -> list[bytes]:
        """The frames (length prefix included) to send the broker for one request frame."""
        try:
            api_key, version, correlation_id = peek_request_prefix(frame)
        except MalformedRequestError:
            return [_INT32.pack(len(frame)) + frame]  # the broker judges garbage, not the proxy
        fault = self.proxy.plan.broker_fault
        decoded = None
        if api_key in (PRODUCE, FETCH):
            with contextlib.suppress(MalformedRequestError, UnknownApiError):
                decoded = decode_request(frame)
        if decoded is None:
            self.pending.append(_Pending(correlation_id, api_key, version))
            return [_INT32.pack(len(frame)) + frame]
        header, body = decoded
        if api_key == FETCH:
            self.pending.append(_Pending(correlation_id, api_key, version))
            if fault == "serve-aborted" and body.isolation_level == READ_COMMITTED:
                self.proxy.broker_faults.fetches_rewritten += 1
                return [encode_request(header, dataclasses.replace(body, isolation_level=READ_UNCOMMITTED))]
            return [_INT32.pack(len(frame)) + frame]
        original = [_INT32.pack(len(frame)) + frame]
        if body.acks == 0:
            return original  # no answer comes, so nothing is pending
        counts = self.proxy.broker_faults
        if fault == "drop-acked-produce" and self.proxy.broker_fault_hits():
            counts.produces_dropped += 1
            counts.dropped_values += _produce_values(body)
            forged = encode_response(correlation_id, _produce_success(header.request_api_version, body))
            self.pending.append(_Pending(correlation_id, api_key, version, forged=forged))
            return []
        self.pending.append(_Pending(correlation_id, api_key, version))
        if fault == "duplicate-produce" and self.proxy.broker_fault_hits():
            copy = _non_idempotent_copy(body)
            if copy is not None:
                self.own_correlation_id -= 1
                own = dataclasses.replace(header, correlation_id=self.own_correlation_id)
                copied = _values_by_partition(copy)
                self.pending.append(
                    _Pending(self.own_correlation_id, api_key, version, swallow=True, copied=copied)
                )
                self.copies_unanswered += 1
                return [*original, encode_request(own, copy)]
        return original

    def _send_forged(self) -> None:
        """Made-up answers go out as soon as every request before them is answered."""
        while self.pending and self.pending[0].forged is not None:
            self.client.write(self.pending.popleft().forged or b"")

    async def responses(self, broker: asyncio.StreamReader) -> None:
        while True:
            prefix = await broker.readexactly(4)
            body = await broker.readexactly(_INT32.unpack(prefix)[0])
            (correlation_id,) = _INT32.unpack_from(body)
            answered = self._answered(correlation_id)
            if answered is not None and answered.swallow:
                self._copy_answered(answered, body)
                if self.client_gone.is_set() and not self.copies_unanswered:
                    return
                continue
            if self.client_gone.is_set():
                continue  # an answer to a client that left: only the copies' answers matter now
            if self.proxy.plan.delay_response_s:
                await asyncio.sleep(self.proxy.plan.delay_response_s)
            if self.proxy.drops_response(answered.api_key if answered else -1):
                self.proxy.responses_dropped += 1
                self.proxy.dropped_by_api[answered.api_key if answered else -1] += 1
                self._count_reset_losses()
                self.client_gone.set()  # the caller resets the client's side: the ack is lost
                continue
            frame = prefix + body
            if self.proxy.rewrite_addresses and answered is not None and answered.api_key in ADDRESS_APIS:
                frame = await self.proxy.rewritten(answered, frame)
            try:
                self.client.write(frame)
                self._send_forged()
                await self.client.drain()
            except ConnectionError:
                self.client_gone.set()  # it left while its answers came: the copies' may still come
                continue
            self.proxy.responses_forwarded += 1

    def _copy_answered(self, copy: _Pending, body: bytes) -> None:
        """Count the values of a copy in each partition whose answer says it was stored."""
        self.copies_unanswered -= 1
        try:
            _, answer = decode_response(copy.api_key, copy.api_version, body)
        except (MalformedRequestError, UnknownApiError):
            return
        copied = copy.copied or {}
        stored = []
        for topic in answer.responses:
            for partition in topic.partition_responses:
                key = _topic_key(topic), partition.index
                if partition.error_code == ErrorCode.none and key in copied:
                    stored.append(copied[key])
        counts = self.proxy.broker_faults
        if len(stored) == len(copied):
            counts.produces_duplicated += 1
        for values in stored:
            counts.duplicated_values += values

    def _count_reset_losses(self) -> None:
        """The reset about to come destroys the answers to every request still waiting on this
        connection too: those to writes are lost acks."""
        for waiting in self.pending:
            if waiting.forged is None and not waiting.swallow:
                self.proxy.dropped_by_api[waiting.api_key] += 1

    def _answered(self, correlation_id: int) -> _Pending | None:
        """The pending request this response answers; made-up answers before it go out first."""
        while self.pending:
            self._send_forged()
            if not self.pending:
                break
            entry = self.pending.popleft()
            if entry.correlation_id == correlation_id:
                return entry
        return None


def _produce_success(version: int, body: Any) -> Any:
    """A Produce response that says every partition was stored, at an offset the broker never gave."""
    responses = [
        {
            # v13 names topics by id (KIP-516).
            "name": getattr(topic, "name", None),
            "topic_id": getattr(topic, "topic_id", None),
            "partition_responses": [
                {"index": data.index, "error_code": 0, "base_offset": -1, "record_errors": []}
                for data in topic.partition_data
            ],
        }
        for topic in body.topic_data
    ]
    return build(response_type(PRODUCE, version), responses=responses, throttle_time=0)


# Record batch v2: where the fields the copy rewrites sit, and where the CRC32C starts.
_CRC_AT, _ATTRIBUTES_AT, _PRODUCER_AT, _RECORDS_AT = 17, 21, 43, 61
_BATCH_LENGTH = struct.Struct(">q i")
_NO_PRODUCER = struct.pack(">q h i", -1, -1, -1)  # producer id, epoch, base sequence
_TRANSACTIONAL, _COMPRESSION = 0x10, 0x07


def _batches(records: bytes) -> list[bytes]:
    found, position = [], 0
    while position + _BATCH_LENGTH.size <= len(records):
        _base_offset, length = _BATCH_LENGTH.unpack_from(records, position)
        found.append(records[position : position + 12 + length])
        position += 12 + length
    return found


def _non_idempotent_copy(body: Any) -> Any | None:
    """The request with every batch stripped of producer id, epoch and sequence; None when a batch
    is transactional (a transactional batch without its producer id is no valid request)."""
    topics = []
    for topic in body.topic_data:
        partitions = []
        for data in topic.partition_data:
            batches = []
            for batch in _batches(data.records or b""):
                (attributes,) = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)
                if attributes & _TRANSACTIONAL:
                    return None
                rewritten = bytearray(batch)
                rewritten[_PRODUCER_AT : _PRODUCER_AT + len(_NO_PRODUCER)] = _NO_PRODUCER
                struct.pack_into(">I", rewritten, _CRC_AT, crc32c(bytes(rewritten[_ATTRIBUTES_AT:])))
                batches.append(bytes(rewritten))
            partitions.append(dataclasses.replace(data, records=b"".join(batches)))
        topics.append(dataclasses.replace(topic, partition_data=tuple(partitions)))
    return dataclasses.replace(body, transactional_id=None, topic_data=tuple(topics))


def _produce_values(body: Any) -> list[str]:
    """The values of the records of a Produce request (uncompressed batches; the lab compresses none)."""
    return [value for values in _values_by_partition(body).values() for value in values]


def _values_by_partition(body: Any) -> dict[tuple[Any, int], list[str]]:
    """`_produce_values` by (topic name or id, partition)."""
    values: dict[tuple[Any, int], list[str]] = {}
    for topic in body.topic_data:
        for data in topic.partition_data:
            partition_values = values.setdefault((_topic_key(topic), data.index), [])
            for batch in _batches(data.records or b""):
                (attributes,) = struct.unpack_from(">h", batch, _ATTRIBUTES_AT)
                if not attributes & _COMPRESSION:
                    partition_values += _record_values(batch)
    return values


def _topic_key(topic: Any) -> Any:
    """How a Produce request and its answer name a topic: by name, or from v13 by id (KIP-516)."""
    return getattr(topic, "name", None) or getattr(topic, "topic_id", None)


def _record_values(batch: bytes) -> list[str]:
    (count,) = _INT32.unpack_from(batch, _RECORDS_AT - 4)
    fields: list[RecordFields] = []
    try:
        scan_records(batch, _RECORDS_AT, count, fields=fields, produced=False)
    except RecordFormatError:
        return []  # the broker refuses such a batch: no value of it is ever stored
    return [value.decode(errors="replace") for field in fields if (value := field.value(batch)) is not None]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, as a crashed peer or a middlebox would."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
