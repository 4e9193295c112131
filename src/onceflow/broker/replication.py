"""Replication in cluster mode, after Kafka's ReplicaFetcherThread and Partition.

A follower fetches from its leader with Fetch (replica_id = its broker id) and appends the
batches exactly as the leader stored them, so both logs hold the same bytes at the same
offsets. The leader learns each follower's log end offset from the offset it fetches at; the
high watermark is the lowest log end in the ISR.

Before fetching from a new leader, the follower cuts any suffix the leader does not have
(KIP-101/279): it asks the leader with OffsetForLeaderEpoch where its own latest leader epoch
ends there, truncates to that point (`leader_epochs.truncation_point`), and asks again until
the answer is an epoch both logs share.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.broker.inter_broker import exchange
from onceflow.log.batch import BatchHeader, CorruptRecordError, validate_batches
from onceflow.log.errors import LogError
from onceflow.log.leader_epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET, truncation_point
from onceflow.log.log import PartitionLog

log = logging.getLogger(__name__)

FETCH = 1
FETCH_VERSION = 12
OFFSET_FOR_LEADER_EPOCH = 23
OFFSET_FOR_LEADER_EPOCH_VERSION = 4
FETCH_MAX_WAIT_MS = 500
FETCH_MAX_BYTES = 1024 * 1024
# The connection's read buffer holds a whole answer: with asyncio's 64 KiB, reading one pauses
# and resumes the socket (an epoll change each) every 128 KiB.
READ_BUFFER_BYTES = 4 * FETCH_MAX_BYTES
RETRY_AFTER_S = 0.2


class Diverged(Exception):
    """The follower cannot line its log up with the leader's: it stops fetching."""


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
    """Follows one partition's leader until cancelled, or until the logs cannot line up."""

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
        log, high_watermark)` runs after every fetch that brought records or a new high watermark."""
        self.broker_id = broker_id
        self.topic = topic
        self.partition = partition
        self.log = partition_log
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.high_watermark = min(high_watermark, partition_log.log_end_offset)
        self._appended = appended
        self._truncated = False  # until the log is cut to a prefix of the leader's
        self._correlation_id = 0

    async def run(self) -> None:
        try:
            while True:
                try:
                    reader, writer = await asyncio.open_connection(*self.leader, limit=READ_BUFFER_BYTES)
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
        while not self._truncated:
            await self._truncate(reader, writer)
        while True:
            offset = self.log.log_end_offset
            answer = await self._fetch(reader, writer, offset)
            if answer.error_code != ErrorCode.none:
                if answer.error_code == ErrorCode.offset_out_of_range:
                    leader_start = int(answer.log_start_offset)
                    if leader_start <= offset:
                        raise Diverged(f"the leader has no offset {offset}")
                    log.warning(
                        "%s-%d: the leader's log starts at %d, past ours at %d: starting again there",
                        self.topic,
                        self.partition,
                        leader_start,
                        offset,
                    )
                    self.log.truncate_fully_and_start_at(leader_start)
                    continue
                await asyncio.sleep(RETRY_AFTER_S)
                continue
            records = bytes(answer.records or b"")
            try:
                headers = validate_batches(records)
            except CorruptRecordError as error:
                raise ValueError(f"a corrupt batch from the leader: {error}") from error
            position = 0
            for header in headers:
                self._append(header, records[position : position + header.size])
                position += header.size
            if answer.log_start_offset > self.log.log_start_offset:  # DeleteRecords on the leader
                self.log.delete_records_before(answer.log_start_offset)
            high_watermark = min(int(answer.high_watermark), self.log.log_end_offset)
            if headers or high_watermark != self.high_watermark:  # an empty long poll changes nothing
                self.high_watermark = high_watermark
                self._appended(self.topic, self.partition, self.log, high_watermark)

    async def _truncate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One round of KIP-279: ask where our latest epoch ends on the leader, and cut there."""
        epochs = self.log.leader_epochs
        leader_epoch, leader_end = UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epochs.latest_epoch != UNDEFINED_EPOCH:
            answer = await self._offset_for_leader_epoch(reader, writer, epochs.latest_epoch)
            if answer.error_code != ErrorCode.none:
                await asyncio.sleep(RETRY_AFTER_S)  # the leader has not taken its role yet
                return
            leader_epoch, leader_end = answer.leader_epoch, int(answer.end_offset)
        end = self.log.log_end_offset
        point = truncation_point(epochs, end, self.high_watermark, leader_epoch, leader_end)
        if point.offset < end:
            log.warning(
                "%s-%d: truncating to %d (was %d): the leader's epoch %d ends at %d",
                self.topic,
                self.partition,
                point.offset,
                end,
                leader_epoch,
                leader_end,
            )
            try:
                self.log.truncate_to(point.offset, int(time.time() * 1000))
            except ValueError as error:
                raise Diverged(str(error)) from error
            self.high_watermark = min(self.high_watermark, point.offset)
        self._truncated = point.complete

    def _append(self, header: BatchHeader, batch: bytes) -> None:
        if header.base_offset != self.log.log_end_offset:
            end = self.log.log_end_offset
            raise Diverged(f"the leader's batch at {header.base_offset} is not at our end {end}")
        try:
            result = self.log.append(batch, [header], int(time.time() * 1000), replicated=True)
        except LogError as error:
            raise Diverged(f"appending the leader's batch failed: {error}") from error
        if result.duplicate or result.base_offset != header.base_offset:
            raise Diverged(f"the leader's batch at {header.base_offset} was not appended as it is")

    async def _offset_for_leader_epoch(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, epoch: int
    ) -> Any:
        answer = await self._request(
            reader,
            writer,
            OFFSET_FOR_LEADER_EPOCH,
            OFFSET_FOR_LEADER_EPOCH_VERSION,
            {
                "replica_id": self.broker_id,
                "topics": [
                    {
                        "topic": self.topic,
                        "partitions": [
                            {
                                "partition": self.partition,
                                "current_leader_epoch": self.leader_epoch,
                                "leader_epoch": epoch,
                            }
                        ],
                    }
                ],
            },
        )
        return answer.topics[0].partitions[0]

    async def _fetch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, offset: int) -> Any:
        answer = await self._request(
            reader,
            writer,
            FETCH,
            FETCH_VERSION,
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
        return answer.responses[0].partitions[0]

    async def _request(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        api_key: int,
        version: int,
        fields: dict[str, Any],
    ) -> Any:
        self._correlation_id += 1
        return await exchange(reader, writer, self.broker_id, self._correlation_id, api_key, version, fields)
