"""Partition flushes (group commit per partition): each partition has at most one flush under
way, and whatever is appended to it meanwhile shares its next one. Partitions do not wait for
each other: a partition's flush starts as soon as it is asked for and its previous one has
ended, so an acks=all answer waits for its own partition's fsyncs only. (Global rounds, where
a partition appended to during a round waited for every fsync of that round before its own,
made 1 MB produce requests wait 1.3 x as long for durability.)

A partition's flush is usually one fdatasync of its active segment (`begin_data_flush`), which
goes to the kernel from the event loop (`KernelFdatasyncs`); a flush that needs more (a new
segment's directory entry, a new leader epoch's checkpoint, a rolled segment's indexes, the
transaction index) runs on a thread, as every flush does where Linux AIO is missing.

A failed flush is not tried again. After a failed fsync Linux may mark the pages it could not
write clean and report the error once, so a second fsync can succeed with the data lost: a retry
would acknowledge writes that are not on disk (PostgreSQL's "fsyncgate"). The flushes stop there
and `flush_failed` tells the broker, which halts as Kafka does when its only log directory fails.
A flush that could not begin a sync (`SyncNotStarted`: no descriptor to open a directory with,
no space for a new checkpoint file) ran no fsync, so it is tried again a little later; what it
was to make durable stays unacknowledged until then.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Collection
from concurrent.futures import Executor

from onceflow import failpoints
from onceflow.broker.kernel_fdatasyncs import KernelFdatasyncs
from onceflow.broker.metrics import FLUSH_BY_KERNEL, FLUSH_ON_THREAD
from onceflow.coordinator.runtime import DurableLog
from onceflow.log.files import SyncNotStarted
from onceflow.log_limits import once_per_interval

log = logging.getLogger(__name__)
_repeated = once_per_interval(__name__)

FLUSH_FAILS_ONCE = "flush.eio-once"
# After a flush that could not begin (descriptors or space run out): long enough not to spin,
# short against a producer's request timeout.
NOT_STARTED_RETRY_S = 0.1


class PartitionFlushes:
    def __init__(
        self,
        threads: Executor,
        flush_timed: Callable[[float, str], None],
        flush_ended: Callable[[Collection[DurableLog], float], None],
        flush_failed: Callable[[DurableLog, Exception], None],
        flush_not_started: Callable[[], None],
    ) -> None:
        """`flush_timed(seconds, how)` after each partition's flush (`how`: one of
        `metrics.FLUSH_HOWS`); `flush_ended(partitions, perf_counter)` once the flushed offsets
        of `partitions` have moved; `flush_failed(partition, error)` once, at the first failed
        flush, after which no flush starts; `flush_not_started()` at each flush that could not
        begin a sync, to be tried again."""
        self.dirty: set[DurableLog] = set()  # appended to since their last flush began
        self._threads = threads
        self._flush_timed = flush_timed
        self._flush_ended = flush_ended
        self._flush_failed = flush_failed
        self._flush_not_started = flush_not_started
        self._flushing: dict[DurableLog, asyncio.Task[None]] = {}
        self._asked_again: set[DurableLog] = set()  # dirty and asked for while their flush ran
        self._kernel: KernelFdatasyncs | None = None
        self._start_scheduled = False
        self._stopping = False
        self._failed = False

    def start(self) -> None:
        """On the event loop, which runs the flushes from now on."""
        self._kernel = KernelFdatasyncs.open()

    def request(self) -> None:
        """Flush what is dirty. The flushes start in the loop's next turn, so that the appends of
        this one share them; a partition whose flush is under way starts its next when it ends."""
        if self._start_scheduled or self._stopping:
            return
        asyncio.get_running_loop().call_soon(self._start_flushes)
        self._start_scheduled = True

    async def stop(self) -> None:
        """Start no more flushes, once those under way have ended (their fsyncs cannot be called back)."""
        self._stopping = True
        await asyncio.gather(*self._flushing.values(), return_exceptions=True)  # none start now
        if self._kernel is not None:
            self._kernel.close()
            self._kernel = None  # the kernel's context goes with its last reference

    def _start_flushes(self) -> None:
        self._start_scheduled = False
        if self._stopping:
            return
        ready = []
        for partition in self.dirty:
            if partition in self._flushing:
                self._asked_again.add(partition)
            else:
                ready.append(partition)
        for partition in ready:
            self.dirty.discard(partition)
            self._flushing[partition] = asyncio.create_task(self._flush_and_report(partition))

    async def _flush_and_report(self, partition: DurableLog) -> None:
        failure: BaseException | None = None
        try:
            await self._flush(partition)
        except BaseException as error:  # cancelled too (at shutdown): the books stay right
            failure = error
        del self._flushing[partition]
        if isinstance(failure, SyncNotStarted):
            where = getattr(partition, "directory", "a coordinator's log")
            _repeated.warning("%s: cannot flush (%s); trying again", where, failure)
            self._flush_not_started()
            self._asked_again.discard(partition)
            self.dirty.add(partition)
            asyncio.get_running_loop().call_later(NOT_STARTED_RETRY_S, self.request)
            return
        if isinstance(failure, Exception):
            if not self._failed:  # the first failure; others under way may follow it
                self._failed = self._stopping = True
                self._flush_failed(partition, failure)
            return
        if partition in self._asked_again or failure is not None:
            # A flush cancelled on its way leaves its partition to be flushed again.
            self._asked_again.discard(partition)
            self.dirty.add(partition)
            self.request()
        self._flush_ended((partition,), time.perf_counter())
        if failure is not None:
            raise failure

    async def _flush(self, partition: DurableLog) -> None:
        started = time.perf_counter()
        if failpoints.first_time(FLUSH_FAILS_ONCE):
            raise OSError(errno.EIO, f"fdatasync: Input/output error (failpoint {FLUSH_FAILS_ONCE})")
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
