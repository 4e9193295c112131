"""Flush rounds (group commit): fsyncs run in rounds, one after another, and every partition
appended to while a round runs shares the next one. Within a round the partitions flush in
parallel: the filesystem commits concurrent fsyncs together, which cuts the round's latency.

A partition's flush is usually one fdatasync of its active segment (`begin_data_flush`), which
goes to the kernel from the event loop (`KernelFdatasyncs`); a flush that needs more (a new
segment's directory entry, a rolled segment's indexes, the transaction index) runs on a thread,
as every flush does where Linux AIO is missing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from concurrent.futures import Executor

from onceflow.broker.kernel_fdatasyncs import KernelFdatasyncs
from onceflow.broker.metrics import FLUSH_BY_KERNEL, FLUSH_ON_THREAD
from onceflow.coordinator.runtime import DurableLog

log = logging.getLogger(__name__)

RETRY_AFTER_FAILURE_S = 0.1


class FlushRounds:
    def __init__(
        self,
        threads: Executor,
        flush_timed: Callable[[float, str], None],
        round_ended: Callable[[Collection[DurableLog], float], None],
    ) -> None:
        """`flush_timed(seconds, how)` after each partition's flush (`how`: one of
        `metrics.FLUSH_HOWS`); `round_ended(partitions, perf_counter)` after each round, once the
        partitions' flushed offsets have moved."""
        self.dirty: set[DurableLog] = set()  # appended to since their last flush began
        self._threads = threads
        self._flush_timed = flush_timed
        self._round_ended = round_ended
        self._requested = asyncio.Event()
        self._kernel: KernelFdatasyncs | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        """On the event loop, which runs the rounds from now on."""
        self._kernel = KernelFdatasyncs.open()
        self._task = asyncio.create_task(self._run(), name="flush-rounds")

    def request(self) -> None:
        """Flush what is dirty: in the next round, which starts at once if none is under way."""
        self._requested.set()

    async def stop(self) -> None:
        """Start no more rounds, once the one under way has ended (its fsyncs cannot be called back)."""
        self._stopping = True
        self._requested.set()
        if self._task is not None:
            await self._task
        if self._kernel is not None:
            self._kernel.close()
            self._kernel = None  # the kernel's context goes with its last reference

    async def _run(self) -> None:
        while True:
            await self._requested.wait()
            if self._stopping:
                return
            self._requested.clear()
            if not self.dirty:
                # Nothing to flush, so no round: with nothing to await, its end asking for
                # another (a waiter still short of its offset) would never let the loop run.
                continue
            partitions = list(self.dirty)
            self.dirty = set()
            outcomes = await asyncio.gather(*map(self._flush, partitions), return_exceptions=True)
            failed = [(p, error) for p, error in zip(partitions, outcomes, strict=True) if error is not None]
            for partition, error in failed:
                log.error("fsync failed; acks=all producers will time out and retry", exc_info=error)
                self.dirty.add(partition)
            self._round_ended(partitions, time.perf_counter())
            if failed:
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                self._requested.set()

    async def _flush(self, partition: DurableLog) -> None:
        started = time.perf_counter()
        kernel = self._kernel
        data_flush = partition.begin_data_flush() if kernel is not None else None
        if kernel is None or data_flush is None:
            await asyncio.get_running_loop().run_in_executor(self._threads, partition.flush)
            how = FLUSH_ON_THREAD
        else:
            synced = False
            try:
                await kernel.fdatasync(data_flush.fd)
                synced = True
            finally:
                data_flush.finish(synced)
            how = FLUSH_BY_KERNEL
        self._flush_timed(time.perf_counter() - started, how)
