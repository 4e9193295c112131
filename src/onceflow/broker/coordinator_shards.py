"""One internal topic's coordinators on this broker: a state machine for each of its partitions
that this broker leads, after Kafka's CoordinatorRuntime (`onElection`, `onResignation`).

Elected (this broker became the partition's leader), a shard is built and its partition replayed
into it: at once when the log is short, else step by step on the event loop, and until then its
keys are answered COORDINATOR_LOAD_IN_PROGRESS. Resigned (the leadership went), it is dropped:
its keys are answered NOT_COORDINATOR, and so is what waited on it. A shard keeps the leader
epoch it was elected at: that is its coordinator epoch, which transaction markers carry.
"""

from __future__ import annotations

import asyncio
import logging
import time
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
    _loading: asyncio.Task[None] | None = field(default=None, repr=False)


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
        `at_once` (a single broker's start, before it serves). A shard it has already stays,
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
        elif next(steps, _DONE) is _DONE:
            self._loaded(shard)
        else:
            log.info("loading %s-%d (epoch %d)", self.topic, partition, epoch)
            shard._loading = asyncio.create_task(
                self._load(shard, steps), name=f"load-{self.topic}-{partition}"
            )
        return shard

    async def _load(self, shard: Shard[C], steps: Iterator[None]) -> None:
        for _ in steps:
            await asyncio.sleep(0)  # the broker serves between two steps
        shard._loading = None
        self._loaded(shard)

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
        if shard._loading is not None:
            shard._loading.cancel()
        log.info("%s-%d resigned (epoch %d)", self.topic, partition, shard.epoch)
        if shard.loaded:
            self._on_resigned(shard)

    def resign_all_but(self, partitions: set[int]) -> None:
        for partition in [partition for partition in self._shards if partition not in partitions]:
            self.resign(partition)


_DONE = object()
