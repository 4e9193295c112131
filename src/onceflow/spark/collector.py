"""Python's cyclic garbage collector: paused while a task moves records, and kept off what a
Python worker holds between tasks.

A read task holds up to 10,000 confluent-kafka Messages at a time, and the collector tracks each
one: every 700 of them start a collection, and the survivors are promoted until a full collection
walks every object in the worker (some 80,000 before the first record). Records form no reference
cycles, so reference counting alone frees them; the collector only cost time. 250,000 records of
100 B read by `read_range`: 340-400k records/s with it, 620-760k without.

Between tasks, PySpark's daemon runs a full collection in every reused worker (`gc.collect()`
after each task, in `pyspark/daemon.py`), which walks every object pyarrow, pandas, PySpark and
confluent-kafka left there: 53 ms of a worker's CPU per task that read 4 records (160 tasks), 4.4
ms with those objects frozen. A streaming micro-batch pays it in both workers of each task and in
the driver's commit. `freeze_between_tasks` freezes, as a task starts, what is alive then
(`gc.freeze`: out of every later collection's reach), which the last task's collection left alive;
the collection after the task then walks this task's objects only. A frozen object that later
becomes part of a garbage cycle is not collected, so every `FULL_COLLECTION_EVERY` tasks the
worker unfreezes and collects everything once.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

FULL_COLLECTION_EVERY = 100
_tasks_since_full_collection = 0


def freeze_between_tasks() -> None:
    """At the start of a task in a reused Python worker (or of a driver-side call such as a
    sink's commit): freeze what is alive, with a full collection first every so many tasks."""
    global _tasks_since_full_collection
    _tasks_since_full_collection += 1
    if _tasks_since_full_collection >= FULL_COLLECTION_EVERY:
        _tasks_since_full_collection = 0
        gc.unfreeze()
        gc.collect()
    gc.freeze()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside the block; the collector's state is restored after it, so an
    inner block in an outer one leaves it off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
