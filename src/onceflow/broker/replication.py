"""Replication in cluster mode, after Kafka's ReplicaFetcherThread and Partition.

A follower fetches from its leader with Fetch (replica_id = its broker id) and appends the
batches exactly as the leader stored them, so both logs hold the same bytes at the same
offsets. The leader learns each follower's log end offset from the offset it fetches at; the
high watermark is the lowest log end in the ISR.

Logs are never truncated here (Kafka truncates a follower to its leader's log). So a follower
that starts following a leader first checks, batch by batch, that its records past the high
watermark it last learned are the leader's too; if one differs, or does not line up, it stops
fetching that partition, and its leader drops it from the ISR once it has lagged for
replica.lag.time.max.ms. A replica outside the ISR starts from an empty log instead (the broker
empties it), and its leader takes it back into the ISR once it fetches at the high watermark.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.log.batch import BatchHeader, CorruptRecordError, validate_batches
from onceflow.log.errors import LogError
from onceflow.log.log import PartitionLog
from onceflow.protocol.build import build
from onceflow.protocol.codec import decode_response, encode_request, request_type

log = logging.getLogger(__name__)

FETCH = 1
FETCH_VERSION = 12
FETCH_MAX_WAIT_MS = 500
FETCH_MAX_BYTES = 1024 * 1024
RETRY_AFTER_S = 0.2
_INT32 = struct.Struct(">i")


class Diverged(Exception):
    """The follower's log is not a prefix of the leader's: it stops fetching."""


@dataclass
class LeaderState:
    """What the leader of a partition knows of its followers."""

    leader_epoch: int
    started_ms: int
    log_end: dict[int, int] = field(default_factory=dict)
    caught_up_ms: dict[int, int] = field(default_factory=dict)

    def fetched(self, replica_id: int, fetch_offset: int, leader_log_end: int, now_ms: int) -> None:
        self.log_end[replica_id] = fetch_offset
        if fetch_offset >= leader_log_end:
            self.caught_up_ms[replica_id] = now_ms

    def lagging(self, isr: tuple[int, ...], leader_id: int, lag_ms: int, now_ms: int) -> list[int]:
        """ISR members that have not caught up for `lag_ms` (Kafka's replica.lag.time.max.ms)."""
        return [
            replica
            for replica in isr
            if replica != leader_id and now_ms - self.caught_up_ms.get(replica, self.started_ms) > lag_ms
        ]


class ReplicaFetcher:
    """Follows one partition's leader until cancelled, or until the logs diverge."""

    def __init__(
        self,
        broker_id: int,
        topic: str,
        partition: int,
        partition_log: PartitionLog,
        leader: tuple[str, int],
        leader_epoch: int,
        high_watermark: int,
        appended: Callable[[str, int, PartitionLog, int], None],
    ) -> None:
        """`high_watermark` is the last one this broker learned; `appended(topic, partition,
        log, high_watermark)` runs after every fetch."""
        self.broker_id = broker_id
        self.topic = topic
        self.partition = partition
        self.log = partition_log
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.high_watermark = min(high_watermark, partition_log.log_end_offset)
        self._appended = appended
        self._verified_to: int | None = None  # None until the log is checked against the leader's
        self._correlation_id = 0

    async def run(self) -> None:
        try:
            while True:
                try:
                    reader, writer = await asyncio.open_connection(*self.leader)
                except OSError:
                    await asyncio.sleep(RETRY_AFTER_S)
                    continue
                try:
                    await self._follow(reader, writer)
                except (OSError, asyncio.IncompleteReadError, ValueError) as error:
                    log.info("fetching %s-%d from %s: %s", self.topic, self.partition, self.leader, error)
                    await asyncio.sleep(RETRY_AFTER_S)
                finally:
                    writer.close()
        except Diverged as diverged:
            log.error("%s-%d stops following its leader: %s", self.topic, self.partition, diverged)

    async def _follow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            offset = self._next_offset()
            answer = await self._fetch(reader, writer, offset)
            if answer.error_code != ErrorCode.none:
                if answer.error_code == ErrorCode.offset_out_of_range:
                    raise Diverged(f"the leader has no offset {offset}")
                await asyncio.sleep(RETRY_AFTER_S)
                continue
            records = bytes(answer.records or b"")
            try:
                headers = validate_batches(records)
            except CorruptRecordError as error:
                raise ValueError(f"a corrupt batch from the leader: {error}") from error
            position = 0
            for header in headers:
                batch = records[position : position + header.size]
                position += header.size
                if self._verified_to is None:
                    self._check(header, batch)
                else:
                    self._append(header, batch)
            end = self.log.log_end_offset
            if self._verified_to is None and headers and headers[-1].last_offset + 1 >= end:
                self._verified_to = end  # every batch of ours was the leader's
            self.high_watermark = min(int(answer.high_watermark), self.log.log_end_offset)
            self._appended(self.topic, self.partition, self.log, self.high_watermark)

    def _next_offset(self) -> int:
        if self._verified_to is not None:
            return self.log.log_end_offset
        if self.high_watermark >= self.log.log_end_offset:
            self._verified_to = self.log.log_end_offset  # nothing past the high watermark to check
            return self.log.log_end_offset
        return self.high_watermark

    def _check(self, header: BatchHeader, batch: bytes) -> None:
        """One of the leader's batches against ours at the same offset, while ours last."""
        end = self.log.log_end_offset
        if header.base_offset >= end:
            if header.base_offset != end:
                raise Diverged(f"the leader's batch at {header.base_offset} skips past our end {end}")
            self._verified_to = end
            self._append(header, batch)
            return
        ours = self.log.read(header.base_offset, header.size, end)[: header.size]
        if ours != batch:
            raise Diverged(f"our batch at offset {header.base_offset} is not the leader's")
        self.high_watermark = max(self.high_watermark, header.last_offset + 1)

    def _append(self, header: BatchHeader, batch: bytes) -> None:
        if header.base_offset != self.log.log_end_offset:
            end = self.log.log_end_offset
            raise Diverged(f"the leader's batch at {header.base_offset} is not at our end {end}")
        try:
            result = self.log.append(bytearray(batch), [header], int(time.time() * 1000))
        except LogError as error:
            raise Diverged(f"appending the leader's batch failed: {error}") from error
        if result.duplicate or result.base_offset != header.base_offset:
            raise Diverged(f"the leader's batch at {header.base_offset} was not appended as it is")

    async def _fetch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, offset: int) -> Any:
        self._correlation_id += 1
        body = build(
            request_type(FETCH, FETCH_VERSION),
            {
                "replica_id": self.broker_id,
                "max_wait": FETCH_MAX_WAIT_MS,
                "min_bytes": 1,
                "max_bytes": FETCH_MAX_BYTES,
                "isolation_level": 0,
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": self.topic,
                        "partitions": [
                            {
                                "partition": self.partition,
                                "current_leader_epoch": self.leader_epoch,
                                "fetch_offset": offset,
                                "last_fetched_epoch": -1,
                                "log_start_offset": -1,
                                "partition_max_bytes": FETCH_MAX_BYTES,
                            }
                        ],
                    }
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            },
        )
        header = build(
            body.__header_schema__,
            request_api_key=FETCH,
            request_api_version=FETCH_VERSION,
            correlation_id=self._correlation_id,
            client_id=f"onceflow-replica-{self.broker_id}",
        )
        writer.write(encode_request(header, body))
        await writer.drain()
        size = _INT32.unpack(await reader.readexactly(4))[0]
        correlation_id, response = decode_response(FETCH, FETCH_VERSION, await reader.readexactly(size))
        if correlation_id != self._correlation_id:
            raise ValueError(f"answer {correlation_id} to request {self._correlation_id}")
        return response.responses[0].partitions[0]
