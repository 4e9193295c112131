"""A fetch reads each segment range once and walks its headers once, and returns exactly what
the batch-by-batch rule gives: whole batches from the one holding the offset, at least one,
up to max_bytes, none at or past max_offset, from one segment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.log.log import PartitionLog
from tests.log.batches import make_batch
from tests.log.helpers import append, open_log


def _filled(directory: Path) -> PartitionLog:
    """Batches of 1 to 4 records and 10 to 300 bytes of values, over a few segments."""
    log = open_log(directory, segment_bytes=6000, index_interval_bytes=500)
    for i in range(120):
        append(log, make_batch(1 + i % 4, value_size=10 + (i * 37) % 290))
    assert log.segment_count > 2
    return log


def _expected(log: PartitionLog, offset: int, max_bytes: int, max_offset: int) -> tuple[bytes, int]:
    if offset >= max_offset:  # a consumer at the end
        return b"", -1
    for segment in log.segments:
        batches = list(segment.batches())
        start = next((i for i, (header, _) in enumerate(batches) if header.last_offset >= offset), None)
        if start is None:
            continue
        if batches[start][0].base_offset >= max_offset:
            return b"", -1
        cap = max(max_bytes, batches[start][0].size)
        taken = [batches[start]]
        for header, data in batches[start + 1 :]:
            if header.base_offset >= max_offset or sum(h.size for h, _ in taken) + header.size > cap:
                break
            taken.append((header, data))
        return b"".join(data for _, data in taken), taken[-1][0].last_offset + 1
    return b"", -1


END = 300  # the end offset of `_filled`'s log


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PartitionLog]:
    log = _filled(tmp_path_factory.mktemp("log"))
    assert log.log_end_offset == END
    yield log
    log.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    offset=st.integers(min_value=0, max_value=END),
    max_bytes=st.integers(min_value=1, max_value=3000),
    max_offset=st.integers(min_value=0, max_value=END + 2),
)
def test_a_read_returns_what_the_batch_by_batch_rule_gives(
    filled: PartitionLog, offset: int, max_bytes: int, max_offset: int
) -> None:
    fetched = filled.read_batches(offset, max_bytes, max_offset)
    records, next_offset = _expected(filled, offset, max_bytes, min(max_offset, END))
    assert fetched.records == records
    if records:
        assert fetched.next_offset == next_offset


def test_a_read_within_reach_of_an_index_entry_is_one_pread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _filled(tmp_path)
    real_pread = os.pread
    calls: list[int] = []

    def pread(fd: int, size: int, position: int) -> bytes:
        calls.append(size)
        return real_pread(fd, size, position)

    monkeypatch.setattr(os, "pread", pread)
    for offset in range(0, log.log_end_offset, 7):
        calls.clear()
        assert log.read(offset, 2000)
        assert len(calls) == 1, f"{len(calls)} reads for offset {offset}"
