"""Python's cyclic garbage collector, paused while a task moves records.

A read task holds up to 10,000 confluent-kafka Messages at a time, and the collector tracks each
one: every 700 of them start a collection, and the survivors are promoted until a full collection
walks every object in the worker (some 80,000 before the first record). Records form no reference
cycles, so reference counting alone frees them; the collector only cost time. 250,000 records of
100 B read by `read_range`: 340-400k records/s with it, 620-760k without.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


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
