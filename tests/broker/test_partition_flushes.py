"""Partition flushes without a broker: logs in memory whose flushes run on threads, held at will."""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor

from onceflow.broker.partition_flushes import PartitionFlushes
from onceflow.coordinator.runtime import DurableLog
from onceflow.log.files import SyncNotStarted


class HeldLog:
    """A log whose `flush` waits for `released`, and fails once after `fail_once` (once without
    starting, `SyncNotStarted`, after `not_started_once`)."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.log_end_offset = 0
        self.flushed_offset = 0
        self.closed = False
        self.released = threading.Event()
        self.released.set()
        self.started = threading.Event()
        self.fail_once = False
        self.not_started_once = False
        self._events = events

    def flush(self) -> int:
        end = self.log_end_offset  # a flush covers what was appended before it began
        self._events.append(f"{self.name} starts")
        self.started.set()
        assert self.released.wait(30)
        if self.fail_once:
            self.fail_once = False
            raise OSError(f"{self.name}: no space left on device")
        if self.not_started_once:
            self.not_started_once = False
            raise SyncNotStarted(errno.EMFILE, "Too many open files", self.name)
        self.flushed_offset = end
        return end

    def begin_data_flush(self) -> None:
        return None  # every flush on a thread


def _ended(events: list[str]) -> Callable[[Collection[DurableLog], float], None]:
    def ended(partitions: Collection[DurableLog], _at: float) -> None:
        for partition in partitions:
            events.append(f"{partition.name} flushed to {partition.flushed_offset}")  # type: ignore[attr-defined]

    return ended


def _no_failure(partition: DurableLog, error: Exception) -> None:
    raise AssertionError(f"a flush failed: {error}")


def _flushes(events: list[str]) -> PartitionFlushes:
    return PartitionFlushes(
        ThreadPoolExecutor(4),
        lambda _seconds, _how: None,
        _ended(events),
        _no_failure,
        lambda: events.append("retry"),
    )


def _append(flushes: PartitionFlushes, log: HeldLog) -> None:
    log.log_end_offset += 1
    flushes.dirty.add(log)
    flushes.request()


async def _until(condition: threading.Event) -> None:
    async with asyncio.timeout(30):
        while not condition.is_set():
            await asyncio.sleep(0.001)


async def _until_event(events: list[str], event: str) -> None:
    async with asyncio.timeout(30):
        while event not in events:
            await asyncio.sleep(0.001)


async def _a_held_flush_under_way(events: list[str]) -> tuple[PartitionFlushes, HeldLog, HeldLog]:
    """Started flushes, logs a and b, and a's flush under way, held until `a.released`."""
    flushes = _flushes(events)
    flushes.start()
    a, b = HeldLog("a", events), HeldLog("b", events)
    a.released.clear()
    _append(flushes, a)
    await _until(a.started)
    return flushes, a, b


def test_appends_during_a_flush_share_the_next_one_and_other_partitions_do_not_wait() -> None:
    async def run() -> list[str]:
        events: list[str] = []
        flushes, a, b = await _a_held_flush_under_way(events)
        _append(flushes, a)
        _append(flushes, a)
        _append(flushes, b)
        await _until_event(events, "b flushed to 1")  # while a's first flush is still held
        a.released.set()
        await _until_event(events, "a flushed to 3")
        await flushes.stop()
        return events

    assert asyncio.run(run()) == [
        "a starts",
        "b starts",
        "b flushed to 1",
        "a flushed to 1",
        "a starts",  # one flush for both appends made while the first was under way
        "a flushed to 3",
    ]


def test_a_failed_flush_is_reported_once_and_no_flush_follows_it() -> None:
    # After a failed fsync, Linux may have marked the unwritten pages clean: a second fsync would
    # succeed without them, so a retry would acknowledge data that is not on disk.
    async def run() -> tuple[list[str], list[tuple[str, str]]]:
        events: list[str] = []
        failures: list[tuple[str, str]] = []

        def failed(partition: DurableLog, error: Exception) -> None:
            failures.append((partition.name, str(error)))  # type: ignore[attr-defined]

        flushes = PartitionFlushes(
            ThreadPoolExecutor(4), lambda _seconds, _how: None, _ended(events), failed, lambda: None
        )
        flushes.start()
        a, b = HeldLog("a", events), HeldLog("b", events)
        a.fail_once = True
        _append(flushes, a)
        async with asyncio.timeout(30):
            while not failures:
                await asyncio.sleep(0.001)
        _append(flushes, a)
        _append(flushes, b)
        for _ in range(20):  # turns of the loop in which a flush would have started
            await asyncio.sleep(0.005)
        await flushes.stop()
        return events, failures

    events, failures = asyncio.run(run())
    assert failures == [("a", "a: no space left on device")]
    assert events == ["a starts"]  # neither tried again nor another partition flushed after it


def test_a_flush_that_could_not_start_a_sync_is_tried_again_and_then_counts() -> None:
    # No fsync ran (no descriptor to open the directory with), so no page was marked clean: a
    # retry is safe, and halting the broker for it would fail every client.
    async def run() -> list[str]:
        events: list[str] = []
        flushes = _flushes(events)  # fails the test at any report of a failed flush
        flushes.start()
        a = HeldLog("a", events)
        a.not_started_once = True
        _append(flushes, a)
        await _until_event(events, "a flushed to 1")
        await flushes.stop()
        return events

    assert asyncio.run(run()) == ["a starts", "retry", "a starts", "a flushed to 1"]


def test_stop_waits_for_the_flushes_under_way_and_starts_no_other() -> None:
    async def run() -> list[str]:
        events: list[str] = []
        flushes, a, b = await _a_held_flush_under_way(events)
        stopping = asyncio.create_task(flushes.stop())
        _append(flushes, b)
        for _ in range(10):
            await asyncio.sleep(0)
        assert not stopping.done()
        a.released.set()
        await asyncio.wait_for(stopping, 30)
        _append(flushes, b)
        for _ in range(10):
            await asyncio.sleep(0)
        return events

    assert asyncio.run(run()) == ["a starts", "a flushed to 1"]


def test_a_request_with_nothing_dirty_flushes_nothing() -> None:
    # A flush's end that asks for another, with nothing dirty, must not keep the loop busy.
    async def run() -> list[str]:
        events: list[str] = []
        flushes: PartitionFlushes

        def ended(_partitions: Collection[DurableLog], _at: float) -> None:
            events.append("flush")
            if len(events) < 100:  # the bound lets a failing run end
                flushes.request()

        flushes = PartitionFlushes(
            ThreadPoolExecutor(1), lambda _seconds, _how: None, ended, _no_failure, lambda: None
        )
        flushes.start()
        flushes.request()
        await asyncio.sleep(0.01)
        await flushes.stop()
        return events

    assert asyncio.run(run()) == []


def test_a_flush_cancelled_midway_leaves_its_partition_to_be_flushed_again() -> None:
    async def run() -> list[str]:
        events: list[str] = []
        flushes, a, _ = await _a_held_flush_under_way(events)
        flushes._flushing[a].cancel()  # as a cancelled shutdown would
        await _until_event(events, "a flushed to 0")
        a.released.set()  # the first fsync's thread ends; the retry flushes
        await _until_event(events, "a flushed to 1")
        await asyncio.wait_for(flushes.stop(), 30)
        return events

    assert asyncio.run(run())[-1] == "a flushed to 1"
