"""Flush rounds without a broker: logs in memory whose flushes run on threads, held at will."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor

from onceflow.broker.flush_rounds import FlushRounds
from onceflow.coordinator.runtime import DurableLog


class HeldLog:
    """A log whose `flush` waits for `release`, and fails once after `fail_once`."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.log_end_offset = 0
        self.flushed_offset = 0
        self.closed = False
        self.released = threading.Event()
        self.released.set()
        self.started = threading.Event()
        self.fail_once = False
        self._events = events

    def flush(self) -> int:
        self._events.append(f"{self.name} starts")
        self.started.set()
        assert self.released.wait(30)
        if self.fail_once:
            self.fail_once = False
            raise OSError(f"{self.name}: no space left on device")
        self.flushed_offset = self.log_end_offset
        return self.flushed_offset

    def begin_data_flush(self) -> None:
        return None  # every flush on a thread


def _rounds(events: list[str]) -> FlushRounds:
    def ended(partitions: Collection[DurableLog], _at: float) -> None:
        events.append("round of " + "+".join(sorted(p.name for p in partitions)))  # type: ignore[attr-defined]

    return FlushRounds(ThreadPoolExecutor(4), lambda _seconds, _how: None, ended)


async def _until(condition: threading.Event) -> None:
    async with asyncio.timeout(30):
        while not condition.is_set():
            await asyncio.sleep(0.001)


def test_what_is_appended_during_a_round_shares_the_next_one() -> None:
    async def run() -> list[str]:
        events: list[str] = []
        rounds = _rounds(events)
        rounds.start()
        a, b, c = (HeldLog(name, events) for name in "abc")
        a.released.clear()
        a.log_end_offset = 1
        rounds.dirty.add(a)
        rounds.request()
        await _until(a.started)
        for log in (b, c):
            log.log_end_offset = 1
            rounds.dirty.add(log)
            rounds.request()
        a.released.set()
        async with asyncio.timeout(30):
            while "round of b+c" not in events:
                await asyncio.sleep(0.001)
        await rounds.stop()
        return events

    events = asyncio.run(run())
    assert events[:2] == ["a starts", "round of a"]
    assert sorted(events[2:4]) == ["b starts", "c starts"]
    assert events[4:] == ["round of b+c"]


def test_a_failed_flush_is_tried_again_and_does_not_hold_back_the_others() -> None:
    async def run() -> tuple[list[str], list[int]]:
        events: list[str] = []
        rounds = _rounds(events)
        rounds.start()
        a, b = HeldLog("a", events), HeldLog("b", events)
        a.fail_once = True
        offsets_at_first_round: list[int] = []
        for log in (a, b):
            log.log_end_offset = 5
            rounds.dirty.add(log)
        rounds.request()
        async with asyncio.timeout(30):
            while events.count("a starts") < 2 or events[-1] != "round of a":
                if events[-1:] == ["round of a+b"] and not offsets_at_first_round:
                    offsets_at_first_round += [a.flushed_offset, b.flushed_offset]
                await asyncio.sleep(0.001)
        await rounds.stop()
        return events, [*offsets_at_first_round, a.flushed_offset]

    events, offsets = asyncio.run(run())
    assert events[-1] == "round of a" and "round of a+b" in events
    assert offsets == [0, 5, 5]  # b durable at the first round's end, a at the retry's


def test_stop_waits_for_the_round_under_way_and_starts_no_other() -> None:
    async def run() -> list[str]:
        events: list[str] = []
        rounds = _rounds(events)
        rounds.start()
        a, b = HeldLog("a", events), HeldLog("b", events)
        a.released.clear()
        a.log_end_offset = b.log_end_offset = 1
        rounds.dirty.add(a)
        rounds.request()
        await _until(a.started)
        stopping = asyncio.create_task(rounds.stop())
        rounds.dirty.add(b)
        rounds.request()
        for _ in range(10):
            await asyncio.sleep(0)
        assert not stopping.done()
        a.released.set()
        await asyncio.wait_for(stopping, 30)
        rounds.request()
        for _ in range(10):
            await asyncio.sleep(0)
        return events

    assert asyncio.run(run()) == ["a starts", "round of a"]


def test_a_request_with_nothing_dirty_runs_no_round() -> None:
    # A round's end that asks for another, with nothing dirty, must not keep the loop busy.
    async def run() -> list[str]:
        events: list[str] = []
        rounds: FlushRounds

        def ended(_partitions: Collection[DurableLog], _at: float) -> None:
            events.append("round")
            if len(events) < 100:  # the bound lets a failing run end
                rounds.request()

        rounds = FlushRounds(ThreadPoolExecutor(1), lambda _seconds, _how: None, ended)
        rounds.start()
        rounds.request()
        await asyncio.sleep(0.01)
        await rounds.stop()
        return events

    assert asyncio.run(run()) == []
