"""When a segment rolls by time, as Kafka's LogSegment.shouldRoll decides it: on the first append
after the segment is older than `segment.ms` less its jitter. Its age runs from its first batch's
timestamp to the newest timestamp being appended (so a log written with old timestamps rolls as
they say), or, when the first batch has no timestamp, from the time the segment was made or
opened to now. Each segment draws its jitter once, below `segment.jitter.ms` and `segment.ms`."""

from __future__ import annotations

import random
from collections.abc import Iterable

from onceflow.log.batch import BatchHeader
from onceflow.log.config import LogConfig
from onceflow.log.segment import LogSegment


def rolls_by_time(
    segment: LogSegment, config: LogConfig, headers: Iterable[BatchHeader], now_ms: int
) -> bool:
    """Whether appending the batches of `headers` at `now_ms` rolls the non-empty `segment`."""
    if segment.roll_jitter_ms is None:
        jitter_bound = min(config.segment_jitter_ms, config.segment_ms)
        segment.roll_jitter_ms = random.randrange(jitter_bound) if jitter_bound > 0 else 0
    first = segment.first_batch_timestamp
    if first >= 0:
        waited = max(header.max_timestamp for header in headers) - first
    else:
        waited = now_ms - segment.created_ms
    return waited > config.segment_ms - segment.roll_jitter_ms
