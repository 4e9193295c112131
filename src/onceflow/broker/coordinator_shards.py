"""One internal topic's coordinators on this broker: a state machine for each of its partitions
that this broker leads, after Kafka's CoordinatorRuntime (`onElection`, `onResignation`).

Elected (this broker became the partition's leader), a shard is built and its partition replayed
into it step by step on the event loop, one step a turn over all the topic's shards being loaded
(a single broker's at once), and until then its keys are answered COORDINATOR_LOAD_IN_PROGRESS.
Resigned (the leadership went), it is dropped: its keys are answered NOT_COORDINATOR, and so is
what waited on it. A shard keeps the leader epoch it was elected at: that is its coordinator
epoch, which transaction markers carry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.internal_topics import partition_for

log = logging.getLogger(__name__)

C = TypeVar("C")


@dataclass(eq=False)
class Shard(Generic[C]):
    """The coordinator of one partition, as loaded at one leadership."""

    topic: str
    partition: int
    epoch: int  # the leader epoch it was elected at: its coordinator epoch
    coordinator: C
    loaded: bool = False
    elected_at: float = field(default_factory=time.monotonic)
    loading_logged: bool = field(default=False, repr=False)  # took more than one step


class CoordinatorShards(Generic[C]):
    def __init__(
        self,
        topic: str,
        build: Callable[[int, int], tuple[C, Iterator[None]]],
        on_loaded: Callable[[Shard[C]], None],
        on_resigned: Callable[[Shard[C]], None],
    ) -> None:
        """`build(partition, epoch)` makes a partition's coordinator and the steps that load it;
        `on_loaded` and `on_resigned` run as a shard starts serving and once it is dropped."""
        self.topic = topic
        self._build = build
        self._on_loaded = on_loaded
        self._on_resigned = on_resigned
        self.partition_count = 0  # of the topic; 0 while it does not exist
        self._shards: dict[int, Shard[C]] = {}
        self._queue: deque[tuple[Shard[C], Iterator[None]]] = deque()  # shards being loaded, in turn
        self._loader: asyncio.Task[None] | None = None  # runs their steps while there are any
        self.longest_load_s = 0.0  # of a shard, from its election to serving (a metric)

    def partition_of(self, key: str) -> int | None:
        """The partition that holds `key`, None while the topic does not exist."""
        return partition_for(key, self.partition_count) if self.partition_count else None

    def for_key(self, key: str) -> Shard[C] | ErrorCode:
        """The loaded shard that coordinates `key`, or the error to answer: NOT_COORDINATOR
        when this broker does not lead its partition, COORDINATOR_LOAD_IN_PROGRESS while it
        loads it."""
        partition = self.partition_of(key)
        return ErrorCode.not_coordinator if partition is None else self.for_partition(partition)

    def for_partition(self, partition: int) -> Shard[C] | ErrorCode:
        shard = self._shards.get(partition)
        if shard is None:
            return ErrorCode.not_coordinator
        if not shard.loaded:
            return ErrorCode.coordinator_load_in_progress
        return shard

    def current(self, shard: Shard[C]) -> bool:
        """Whether `shard` still coordinates its partition (not resigned since)."""
        return self._shards.get(shard.partition) is shard

    def loaded(self) -> list[Shard[C]]:
        return [shard for shard in self._shards.values() if shard.loaded]

    @property
    def loading(self) -> bool:
        return any(not shard.loaded for shard in self._shards.values())

    def leads_at(self, partition: int, epoch: int) -> bool:
        """Whether this broker coordinates `partition` in the leadership elected at `epoch`."""
        shard = self._shards.get(partition)
        return shard is not None and shard.epoch == epoch

    def elect(self, partition: int, epoch: int, at_once: bool = False) -> Shard[C]:
        """This broker leads `partition` from `epoch` on: load its shard, step by step unless
        `at_once` (a single broker's, which never change leader). A shard it has already stays,
        with its epoch: a new epoch of the same leader (an ISR change makes one) changes nothing
        it holds."""
        shard = self._shards.get(partition)
        if shard is not None:
            return shard
        coordinator, steps = self._build(partition, epoch)
        shard = Shard(self.topic, partition, epoch, coordinator)
        self._shards[partition] = shard
        if at_once:
            for _ in steps:
                pass
            self._loaded(shard)
            return shard
        # Not even a first step here: a broker's death makes the survivors leaders of dozens of
        # internal partitions in one callback, whose first steps together held its event loop
        # for a fifth of a second.
        self._queue.append((shard, steps))
        if self._loader is None:
            self._loader = asyncio.create_task(self._load(), name=f"load-{self.topic}")
        return shard

    async def _load(self) -> None:
        """One step a turn of the event loop, over the shards being loaded in turn: the broker
        serves between two steps, and a short shard does not wait for a long one's."""
        try:
            while self._queue:
                shard, steps = self._queue.popleft()
                if self.current(shard):  # not resigned meanwhile
                    self._step(shard, steps)
                    await asyncio.sleep(0)
        finally:
            self._loader = None

    def _step(self, shard: Shard[C], steps: Iterator[None]) -> None:
        """One step of a shard's load, queued again for the next unless that was its last."""
        try:
            done = next(steps, _DONE) is _DONE
        except Exception:  # its log unreadable: it answers LOAD_IN_PROGRESS, the others load
            log.exception("loading %s-%d failed", self.topic, shard.partition)
            return
        if done:
            self._loaded(shard)
            return
        if not shard.loading_logged:
            log.info("loading %s-%d (epoch %d)", self.topic, shard.partition, shard.epoch)
            shard.loading_logged = True
        self._queue.append((shard, steps))

    def _loaded(self, shard: Shard[C]) -> None:
        if not self.current(shard):
            return
        shard.loaded = True
        self.longest_load_s = max(self.longest_load_s, time.monotonic() - shard.elected_at)
        log.info("%s-%d loaded: coordinating at epoch %d", self.topic, shard.partition, shard.epoch)
        self._on_loaded(shard)

    def resign(self, partition: int) -> None:
        """This broker no longer leads `partition`: drop its shard."""
        shard = self._shards.pop(partition, None)
        if shard is None:
            return
        log.info("%s-%d resigned (epoch %d)", self.topic, partition, shard.epoch)
        if shard.loaded:
            self._on_resigned(shard)

    def resign_all_but(self, partitions: set[int]) -> None:
        for partition in [partition for partition in self._shards if partition not in partitions]:
            self.resign(partition)


_DONE = object()
