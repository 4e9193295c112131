"""A broker's coordinators, one per internal partition it leads: loaded on election (in steps,
COORDINATOR_LOAD_IN_PROGRESS meanwhile), dropped on resignation (NOT_COORDINATOR), on the real
coordinators over logs in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from kio.schema.errors import ErrorCode

from onceflow.broker.coordinator_shards import CoordinatorShards, Shard
from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import OffsetAndMetadata, Protocol, TopicPartition
from onceflow.coordinator.group_requests import GroupConfig, JoinRequest
from onceflow.coordinator.runtime import REPLAY_STEP_RECORDS
from onceflow.internal_topics import partition_for
from tests.memory_coordinator_log import MemoryLog

PARTITIONS = 3
TP = TopicPartition("t", 0)


class Harness:
    """Group coordinators over one log in memory per partition, as a broker builds them."""

    def __init__(self) -> None:
        self.logs = {index: MemoryLog() for index in range(PARTITIONS)}
        self.loaded: list[int] = []
        self.resigned: list[int] = []
        self.shards: CoordinatorShards[GroupCoordinator] = CoordinatorShards(
            "__consumer_offsets", self.build, self.on_loaded, self.on_resigned
        )
        self.shards.partition_count = PARTITIONS

    def build(self, index: int, epoch: int) -> tuple[GroupCoordinator, Iterator[None]]:
        coordinator = GroupCoordinator(self.logs[index], lambda _: True, GroupConfig(), 0, replay=False)
        return coordinator, coordinator.load(0)

    def on_loaded(self, shard: Shard[GroupCoordinator]) -> None:
        self.loaded.append(shard.partition)

    def on_resigned(self, shard: Shard[GroupCoordinator]) -> None:
        shard.coordinator.unload()
        self.resigned.append(shard.partition)


def group_on(index: int) -> str:
    """A group id that lands on partition `index`."""
    return next(f"g{n}" for n in range(1000) if partition_for(f"g{n}", PARTITIONS) == index)


def commit(shard: Shard[GroupCoordinator] | ErrorCode, group: str, offset: int) -> None:
    assert not isinstance(shard, ErrorCode), shard
    assert shard.coordinator.commit_offsets(group, -1, "", None, {TP: OffsetAndMetadata(offset)}, 0) == {
        TP: ErrorCode.none
    }


async def elect_and_load(harness: Harness, partition: int, epoch: int) -> None:
    harness.shards.elect(partition, epoch)
    while harness.shards.loading:
        await asyncio.sleep(0)


def test_a_short_partition_loads_in_one_step_and_a_long_one_in_several() -> None:
    async def scenario() -> None:
        harness = Harness()
        group = group_on(1)
        # The partition's last leader wrote more than one step of records.
        writer = Harness()
        await elect_and_load(writer, 1, 0)
        for offset in range(REPLAY_STEP_RECORDS + 5):
            commit(writer.shards.for_key(group), group, offset)
        harness.logs[1] = writer.logs[1]

        harness.shards.elect(0, 3)
        harness.shards.elect(1, 4)
        assert harness.shards.for_key(group) == ErrorCode.coordinator_load_in_progress
        await asyncio.sleep(0)
        assert harness.loaded == [0]  # nothing to replay: one step
        assert harness.shards.loading
        while harness.shards.loading:
            await asyncio.sleep(0)
        shard = harness.shards.for_key(group)
        assert not isinstance(shard, ErrorCode) and shard.epoch == 4
        assert shard.coordinator.fetch_offsets(group, [TP], True)[0].offset == OffsetAndMetadata(
            REPLAY_STEP_RECORDS + 4
        )
        assert harness.shards.for_key(group_on(2)) == ErrorCode.not_coordinator  # not led here

    asyncio.run(scenario())


def test_a_resigned_partition_answers_not_coordinator_also_to_what_waited() -> None:
    async def scenario() -> None:
        harness = Harness()
        await elect_and_load(harness, 0, 1)
        shard = harness.shards.for_key(group_on(0))
        assert not isinstance(shard, ErrorCode)
        answers: list[ErrorCode] = []
        protocols = (Protocol("range", b""),)
        join = JoinRequest(group_on(0), "", None, "client", "", 10_000, 10_000, "consumer", protocols, False)
        shard.coordinator.join_group(join, 0, lambda result: answers.append(result.error))
        assert answers == []  # waits out the initial rebalance delay
        harness.shards.resign(0)
        assert answers == [ErrorCode.not_coordinator]
        assert harness.resigned == [0]
        assert harness.shards.for_key(group_on(0)) == ErrorCode.not_coordinator
        assert not harness.shards.current(shard)
        # Elected again (a new leadership, a new epoch): a fresh load of the same log.
        await elect_and_load(harness, 0, 7)
        again = harness.shards.for_key(group_on(0))
        assert not isinstance(again, ErrorCode) and again is not shard and again.epoch == 7

    asyncio.run(scenario())


def test_a_new_epoch_of_the_same_leader_keeps_the_shard_and_its_coordinator_epoch() -> None:
    async def scenario() -> None:
        harness = Harness()
        first = harness.shards.elect(2, 5)
        assert harness.shards.elect(2, 6) is first and first.epoch == 5
        assert harness.shards.leads_at(2, 5) and not harness.shards.leads_at(2, 6)

    asyncio.run(scenario())


def elect_every_partition(
    build: Callable[[int, int], tuple[None, Iterator[None]]], loaded: list[int]
) -> CoordinatorShards[None]:
    """Shards whose loads are `build`'s steps, all elected at once; `loaded` gets each as it loads."""
    shards: CoordinatorShards[None] = CoordinatorShards(
        "__consumer_offsets", build, lambda shard: loaded.append(shard.partition), lambda shard: None
    )
    shards.partition_count = PARTITIONS
    for partition in range(PARTITIONS):
        shards.elect(partition, 1)
    return shards


def test_an_election_runs_no_step_and_the_loads_take_one_step_a_turn_of_the_event_loop() -> None:
    """A broker's death makes the survivors leaders of dozens of internal partitions in one
    callback: their loads run later, one step at a time, so that the broker serves between."""
    steps_run: list[tuple[int, int, int]] = []  # (turn of the event loop, partition, step)
    turn = 0

    def build(partition: int, epoch: int) -> tuple[None, Iterator[None]]:
        def steps() -> Iterator[None]:
            for step in range(partition + 1):  # partition n takes n + 1 steps
                steps_run.append((turn, partition, step))
                if step < partition:
                    yield

        return None, steps()

    async def scenario() -> None:
        nonlocal turn
        loaded: list[int] = []
        shards = elect_every_partition(build, loaded)
        assert steps_run == [] and shards.loading
        while shards.loading:
            turn += 1
            await asyncio.sleep(0)
        turns = [step[0] for step in steps_run]
        assert len(set(turns)) == len(turns) == 1 + 2 + 3  # never two steps in one turn
        assert loaded == [0, 1, 2]  # in turn: the short ones first
        assert [partition for _, partition, _ in steps_run] == [0, 1, 2, 1, 2, 2]

    asyncio.run(scenario())


def test_a_load_that_fails_leaves_its_partition_loading_and_the_others_load() -> None:
    def build(partition: int, epoch: int) -> tuple[None, Iterator[None]]:
        def steps() -> Iterator[None]:
            yield
            if partition == 1:
                raise OSError(5, "Input/output error")

        return None, steps()

    async def scenario() -> None:
        loaded: list[int] = []
        shards = elect_every_partition(build, loaded)
        for _ in range(100):
            await asyncio.sleep(0)
        assert loaded == [0, 2]
        assert shards.for_key(group_on(1)) == ErrorCode.coordinator_load_in_progress

    asyncio.run(scenario())
