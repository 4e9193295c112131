"""Replication in cluster mode, after Kafka's ReplicaFetcherThread and Partition.

A follower fetches from its leader with Fetch (replica_id = its broker id) and appends the
batches exactly as the leader stored them, so both logs hold the same bytes at the same
offsets. One fetcher per leader broker fetches all the partitions followed there with one
request, over one connection, as Kafka's fetcher threads do. The leader learns each follower's
log end offset from the offset it fetches at (`broker.partition`, where the high watermark is
the lowest log end in the ISR).

Before fetching a partition from a new leader, the follower cuts any suffix the leader does not
have (KIP-101/279): it asks the leader with OffsetForLeaderEpoch where its own latest leader
epoch ends there, truncates to that point (`leader_epochs.truncation_point`), and asks again
until the answer is an epoch both logs share.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.broker.fetch_sessions import next_epoch
from onceflow.broker.inter_broker import Link
from onceflow.broker.security import ClientSecurity
from onceflow.log.batch import BatchHeader, CorruptRecordError, validate_batches
from onceflow.log.errors import LogError
from onceflow.log.leader_epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET, truncation_point
from onceflow.log.log import PartitionLog
from onceflow.protocol.fetch_answers import FetchAnswer, PartitionAnswer

log = logging.getLogger(__name__)

OFFSET_FOR_LEADER_EPOCH = 23
OFFSET_FOR_LEADER_EPOCH_VERSION = 4
FETCH_MAX_WAIT_MS = 500
PARTITION_MAX_BYTES = 1024 * 1024  # Kafka's replica.fetch.max.bytes
RESPONSE_MAX_BYTES = 10 * 1024 * 1024  # Kafka's replica.fetch.response.max.bytes
RETRY_AFTER_S = 0.2


# The leader no longer has the follower's fetch session, or not at this epoch.
_SESSION_LOST = (ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch)


class Diverged(Exception):
    """The follower cannot line a partition's log up with the leader's: it stops fetching it."""


@dataclass
class FollowedPartition:
    """A partition a fetcher follows, and how far it got."""

    topic: str
    partition: int
    log: PartitionLog
    leader_epoch: int
    high_watermark: int  # the last one this broker learned
    truncated: bool = False  # until the log is cut to a prefix of the leader's
    retry_at: float = 0.0  # after an error, left out of requests until this monotonic time
    key: tuple[str, int] = field(init=False)  # (topic, partition), looked up on every fetch

    def __post_init__(self) -> None:
        self.key = self.topic, self.partition


class LeaderFetcher:
    """Follows every partition this broker copies from one leader until cancelled; a partition
    whose log cannot line up with the leader's is dropped. The broker starts a new fetcher when
    the partitions followed there, or their leader epochs, change."""

    def __init__(
        self,
        broker_id: int,
        leader: tuple[str, int],
        partitions: Iterable[FollowedPartition],
        appended: Callable[[str, int, PartitionLog, int], None],
        truncated: Callable[[], None],
        security: ClientSecurity | None = None,
    ) -> None:
        """`appended(topic, partition, log, high_watermark)` runs after every fetch that brought
        a partition records or a new high watermark; `truncated()` after a partition's log was
        cut, before anything is appended to it again."""
        self.broker_id = broker_id
        self.leader = leader
        self.partitions = {followed.key: followed for followed in partitions}
        for followed in self.partitions.values():
            followed.high_watermark = min(followed.high_watermark, followed.log.log_end_offset)
        self._appended = appended
        self._truncated = truncated
        self.security = security  # TLS and SASL of the leader's inter-broker listener
        # The fetch session on the leader (KIP-227): its id, the epoch of the next fetch (0 opens
        # a new one, -1 means the leader declines sessions), and the fetch offset it holds for
        # each partition, so that a fetch names only the partitions whose offset moved.
        self._session_id = 0
        self._session_epoch = 0
        self._session_offsets: dict[tuple[str, int], int] = {}

    async def run(self) -> None:
        while self.partitions:
            try:
                link = await Link.open(self.leader, self.broker_id, self.security)
            except OSError:
                await asyncio.sleep(RETRY_AFTER_S)
                continue
            try:
                await self._follow(link)
            except (OSError, ValueError) as error:
                log.info("fetching from %s: %s", self.leader, str(error) or type(error).__name__)
                await asyncio.sleep(RETRY_AFTER_S)
            finally:
                link.close()

    async def _follow(self, link: Link) -> None:
        self._session_epoch = 0  # a new connection: a new session (also with a leader that declined)
        while self.partitions:
            now = time.monotonic()
            # One pass over the partitions a fetch: most of them are idle (`__consumer_offsets`).
            ready, truncating, next_retry_at = [], [], None
            for candidate in self.partitions.values():
                if candidate.retry_at > now:
                    at = candidate.retry_at
                    next_retry_at = at if next_retry_at is None else min(at, next_retry_at)
                    continue
                ready.append(candidate)
                if not candidate.truncated:
                    truncating.append(candidate)
            if truncating:
                await self._truncate(link, truncating)
                continue
            if not ready:
                assert next_retry_at is not None
                await asyncio.sleep(next_retry_at - now)
                continue
            # A partition backing off after an error joins the next request in time.
            wait_ms = FETCH_MAX_WAIT_MS
            if next_retry_at is not None:
                wait_ms = min(wait_ms, int((next_retry_at - now) * 1000) + 1)
            answer = await self._fetch(link, ready, wait_ms)
            if answer.error_code in _SESSION_LOST:
                self._session_epoch = 0  # the leader restarted or dropped it: start another
                continue
            if answer.error_code != ErrorCode.none:
                await asyncio.sleep(RETRY_AFTER_S)
                continue
            for topic in answer.responses:
                for fetched in topic.partitions:
                    followed = self.partitions.get((topic.topic, fetched.partition_index))
                    if followed is not None:
                        self._take(followed, fetched)

    def _take(self, followed: FollowedPartition, fetched: PartitionAnswer) -> None:
        """One partition's part of an answer; its failure is its own."""
        key = followed.key
        try:
            copied = self._fetched(followed, fetched)
        except Diverged as diverged:
            log.error("%s-%d stops following its leader: %s", *key, diverged)
            del self.partitions[key]
            return
        except (ValueError, OSError, LogError) as error:
            log.warning("%s-%d: %s; fetching it again in %.1f s", *key, error, RETRY_AFTER_S)
            followed.retry_at = time.monotonic() + RETRY_AFTER_S
            return
        if copied:
            # To the end of the next request: the leader's byte budget for an answer goes to the
            # partitions first in it, so the others would wait while these have a backlog.
            self.partitions[key] = self.partitions.pop(key)

    def _fetched(self, followed: FollowedPartition, answer: PartitionAnswer) -> bool:
        """Apply one partition's answer: whether it brought records."""
        partition_log = followed.log
        if answer.error_code != ErrorCode.none:
            if answer.error_code == ErrorCode.offset_out_of_range:
                offset = partition_log.log_end_offset
                leader_start = int(answer.log_start_offset)
                if leader_start <= offset:
                    raise Diverged(f"the leader has no offset {offset}")
                log.warning(
                    "%s-%d: the leader's log starts at %d, past ours at %d: starting again there",
                    *followed.key,
                    leader_start,
                    offset,
                )
                partition_log.truncate_fully_and_start_at(leader_start)
                # Kept by the broker too: a fetcher started before the next answer starts from it.
                followed.high_watermark = max(followed.high_watermark, leader_start)
                self._appended(followed.topic, followed.partition, partition_log, followed.high_watermark)
                return False
            followed.retry_at = time.monotonic() + RETRY_AFTER_S
            return False
        records = answer.records or b""  # a view into the link's buffer (`Link.fetch`)
        try:
            headers = validate_batches(records)
        except CorruptRecordError as error:
            raise ValueError(f"a corrupt batch from the leader: {error}") from error
        position = 0
        with memoryview(records) as view:  # each batch appended without a copy of its own
            for header in headers:
                _append(partition_log, header, view[position : position + header.size])
                position += header.size
        if answer.log_start_offset > partition_log.log_start_offset:  # DeleteRecords on the leader
            partition_log.delete_records_before(answer.log_start_offset)
        high_watermark = min(int(answer.high_watermark), partition_log.log_end_offset)
        if headers or high_watermark != followed.high_watermark:  # an empty long poll changes nothing
            followed.high_watermark = high_watermark
            self._appended(followed.topic, followed.partition, partition_log, high_watermark)
        return bool(headers)

    async def _truncate(self, link: Link, truncating: list[FollowedPartition]) -> None:
        """One round of KIP-279 for each partition: ask where our latest epoch ends on the
        leader, and cut there."""
        asking = [
            followed for followed in truncating if followed.log.leader_epochs.latest_epoch != UNDEFINED_EPOCH
        ]
        answers = await self._offsets_for_leader_epochs(link, asking) if asking else {}
        cut = False
        for followed in truncating:
            answer = answers.get(followed.key)
            leader_epoch, leader_end = UNDEFINED_EPOCH, UNDEFINED_OFFSET
            if answer is not None:
                if answer.error_code != ErrorCode.none:  # the leader has not taken its role yet
                    followed.retry_at = time.monotonic() + RETRY_AFTER_S
                    continue
                leader_epoch, leader_end = answer.leader_epoch, int(answer.end_offset)
            try:
                if _cut(followed, leader_epoch, leader_end):
                    cut = True
                    # The broker's high watermark for it goes down too: it would count from it
                    # were it to lead, past what the others hold.
                    self._appended(*followed.key, followed.log, followed.high_watermark)
            except Diverged as diverged:
                log.error("%s-%d stops following its leader: %s", *followed.key, diverged)
                del self.partitions[followed.key]
        if cut:
            self._truncated()

    async def _offsets_for_leader_epochs(
        self, link: Link, asking: list[FollowedPartition]
    ) -> dict[tuple[str, int], Any]:
        answer = await link.exchange(
            OFFSET_FOR_LEADER_EPOCH,
            OFFSET_FOR_LEADER_EPOCH_VERSION,
            {
                "replica_id": self.broker_id,
                "topics": _by_topic(
                    asking,
                    lambda followed: {
                        "partition": followed.partition,
                        "current_leader_epoch": followed.leader_epoch,
                        "leader_epoch": followed.log.leader_epochs.latest_epoch,
                    },
                ),
            },
        )
        return {
            (topic.topic, partition.partition): partition
            for topic in answer.topics
            for partition in topic.partitions
        }

    async def _fetch(
        self,
        link: Link,
        ready: list[FollowedPartition],
        wait_ms: int,
    ) -> FetchAnswer:
        """Fetch the `ready` partitions: in a session, only those whose fetch offset moved
        (the leader's session holds the others'); a new session whenever the set changes."""
        held = self._session_offsets
        same_partitions = len(ready) == len(held)
        ends: dict[tuple[str, int], int] = {}  # of the partitions whose offset moved
        moved = []
        for followed in ready:
            end = followed.log.log_end_offset
            known = held.get(followed.key)
            if known != end:
                moved.append(followed)
                ends[followed.key] = end
                same_partitions = same_partitions and known is not None
        epoch = self._session_epoch
        if epoch > 0 and not same_partitions:
            epoch = 0
        fetching = moved if epoch > 0 else ready
        answer = await link.fetch(
            {
                "replica_id": self.broker_id,
                "max_wait": wait_ms,
                "min_bytes": 1,
                "max_bytes": RESPONSE_MAX_BYTES,
                "isolation_level": 0,
                "session_id": self._session_id if epoch > 0 else 0,
                "session_epoch": epoch,
                "topics": _by_topic(
                    fetching,
                    lambda followed: {
                        "partition": followed.partition,
                        "current_leader_epoch": followed.leader_epoch,
                        "fetch_offset": followed.log.log_end_offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": PARTITION_MAX_BYTES,
                    },
                ),
                "forgotten_topics_data": [],
                "rack_id": "",
            },
        )
        if answer.error_code == ErrorCode.none and epoch >= 0:
            if epoch == 0:
                # What the new session holds: every partition, unmoved ones where they were.
                self._session_offsets = {followed.key: held.get(followed.key, -1) for followed in ready}
                # An answer without a session id: the leader declines sessions; full fetches then.
                self._session_id, self._session_epoch = answer.session_id, 1 if answer.session_id else -1
            else:
                self._session_epoch = next_epoch(self._session_epoch)
            self._session_offsets.update(ends)
        return answer


def _cut(followed: FollowedPartition, leader_epoch: int, leader_end: int) -> bool:
    """Cut the partition's log where the leader's answer says (`truncation_point`); whether
    anything was cut."""
    partition_log = followed.log
    end = partition_log.log_end_offset
    # A high watermark learned before the log start moved (a restart learns none) cannot be
    # cut to: nothing below the start is left.
    high_watermark = max(followed.high_watermark, partition_log.log_start_offset)
    point = truncation_point(partition_log.leader_epochs, end, high_watermark, leader_epoch, leader_end)
    if point.offset < end:
        log.warning(
            "%s-%d: truncating to %d (was %d): the leader's epoch %d ends at %d",
            *followed.key,
            point.offset,
            end,
            leader_epoch,
            leader_end,
        )
        try:
            partition_log.truncate_to(point.offset, int(time.time() * 1000))
        except ValueError as error:
            raise Diverged(str(error)) from error
        followed.high_watermark = min(followed.high_watermark, point.offset)
    followed.truncated = point.complete
    return point.offset < end


def _append(partition_log: PartitionLog, header: BatchHeader, batch: memoryview) -> None:
    if header.base_offset != partition_log.log_end_offset:
        end = partition_log.log_end_offset
        raise Diverged(f"the leader's batch at {header.base_offset} is not at our end {end}")
    try:
        result = partition_log.append(batch, [header], int(time.time() * 1000), replicated=True)
    except LogError as error:
        raise Diverged(f"appending the leader's batch failed: {error}") from error
    if result.duplicate or result.base_offset != header.base_offset:
        raise Diverged(f"the leader's batch at {header.base_offset} was not appended as it is")


def _by_topic(
    partitions: list[FollowedPartition], entry: Callable[[FollowedPartition], dict[str, Any]]
) -> list[dict[str, Any]]:
    """A request's topics (Fetch and OffsetForLeaderEpoch alike): each with its partitions' entries."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for followed in partitions:
        topics.setdefault(followed.topic, []).append(entry(followed))
    return [{"topic": topic, "partitions": entries} for topic, entries in topics.items()]
