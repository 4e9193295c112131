"""Followers' fetch sessions (KIP-227), kept by the leader.

Under load a follower fetches after every append, naming every partition it follows on this
leader, and each idle one costs both brokers work per round trip: eight idle partitions beside
four loaded ones cost a 3-broker produce a tenth of its rate. In a session the follower names
only the partitions whose fetch offset moved, and the answer holds only the partitions with
records, an error, or a high watermark, last stable offset or log start offset other than the
one last sent. Consumers' sessions stay declined: their answers carry session id 0.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from kio.schema.errors import ErrorCode

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition

# A follower has one fetcher per leader; a second session lets a new fetcher start while the
# one it replaces still runs. The oldest beyond that is dropped.
SESSIONS_PER_FOLLOWER = 2
_INT32_MAX = 2**31 - 1


class QuietMark(NamedTuple):
    """A session partition found caught up (`Broker.follower_caught_up`), and what that depended
    on: the leader's partition state, its log's ends and what the follower named. It stays
    caught up while they are the same (`Broker.recheck_quiet`)."""

    partition: Partition
    version: int
    log_end_offset: int
    flushed_offset: int
    log_start_offset: int
    fetch_offset: int
    leader_epoch: int
    sent: tuple[int, int, int] | None


@dataclass
class WantedPartition:
    """A partition of a session, as a fetch request names it."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1  # as last named: checked on every read, named or not
    sent: tuple[int, int, int] | None = None  # high watermark, last stable, log start last answered
    quiet: QuietMark | None = None  # while it is caught up


@dataclass
class WantedTopic:
    topic: str
    partitions: list[WantedPartition] = field(default_factory=list)


@dataclass
class FetchSession:
    session_id: int
    replica_id: int
    epoch: int = 1  # the epoch the next request must carry
    partitions: dict[tuple[str, int], WantedPartition] = field(default_factory=dict)

    def update(self, topics: Any, forgotten: Any) -> None:
        """Take a request's partitions (new ones, moved fetch offsets) and drop forgotten ones."""
        for topic in topics:
            for wanted in topic.partitions:
                key = (topic.topic, wanted.partition)
                known = self.partitions.setdefault(key, WantedPartition(wanted.partition, 0, 0))
                known.fetch_offset = wanted.fetch_offset
                known.partition_max_bytes = wanted.partition_max_bytes
                known.current_leader_epoch = getattr(wanted, "current_leader_epoch", -1)
        for topic in forgotten:
            for partition in topic.partitions:
                self.partitions.pop((topic.topic, partition), None)

    def topics(self) -> list[WantedTopic]:
        """Every partition of the session, as a full fetch would name them."""
        by_topic: dict[str, WantedTopic] = {}
        for (topic, _), wanted in self.partitions.items():
            by_topic.setdefault(topic, WantedTopic(topic)).partitions.append(wanted)
        return list(by_topic.values())

    def changes(self, responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The answer's partitions the follower does not know yet: records, errors, new marks."""
        changed_topics = []
        for topic in responses:
            changed = []
            for answer in topic["partitions"]:
                wanted = self.partitions.get((topic["topic"], answer["partition_index"]))
                marks = (answer["high_watermark"], answer["last_stable_offset"], answer["log_start_offset"])
                if wanted is None or answer["error_code"] != ErrorCode.none:
                    changed.append(answer)  # an error is news every time
                    if wanted is not None:
                        wanted.sent = None
                elif answer["records"] or wanted.sent != marks:
                    changed.append(answer)
                    wanted.sent = marks
                    if answer["records"]:
                        # To the end of the next read: an answer's byte budget goes to the
                        # partitions first in it, so the others would wait behind a backlog.
                        key = (topic["topic"], answer["partition_index"])
                        self.partitions[key] = self.partitions.pop(key)
            if changed:
                changed_topics.append({**topic, "partitions": changed})
        return changed_topics


class FetchSessions:
    """The sessions of this broker's followers, by session id."""

    def __init__(self) -> None:
        self._sessions: dict[int, FetchSession] = {}
        self._ids = itertools.count(1)

    def open(self, replica_id: int, topics: Any) -> FetchSession:
        session = FetchSession(next(self._ids), replica_id)
        session.update(topics, ())
        self._sessions[session.session_id] = session
        mine = [known for known in self._sessions.values() if known.replica_id == replica_id]
        for old in mine[:-SESSIONS_PER_FOLLOWER]:
            del self._sessions[old.session_id]
        return session

    def next_fetch(self, replica_id: int, session_id: int, epoch: int) -> FetchSession | ErrorCode:
        """The session a follower's incremental fetch continues, or why there is none."""
        session = self._sessions.get(session_id)
        if session is None or session.replica_id != replica_id:
            return ErrorCode.fetch_session_id_not_found
        if epoch != session.epoch:
            return ErrorCode.invalid_fetch_session_epoch
        session.epoch = next_epoch(epoch)
        return session

    def close(self, replica_id: int, session_id: int) -> None:
        """The follower is done with the session (a FINAL fetch, or a new one in its place)."""
        session = self._sessions.get(session_id)
        if session is not None and session.replica_id == replica_id:
            del self._sessions[session_id]


def next_epoch(epoch: int) -> int:
    """After the largest int32 comes 1, as in Kafka (0 opens a session)."""
    return epoch + 1 if epoch < _INT32_MAX else 1
