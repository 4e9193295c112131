"""The producer state keeps the open transactions' first offsets incrementally: whatever the
sequence of batches, markers, epoch bumps, expiries and snapshot reloads, its first unstable
offset is the one a scan of every producer gives."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.log.batch import encode_control_batch, parse_batch_header
from onceflow.log.producer_state import ProducerStateManager
from tests.log.batches import TRANSACTIONAL, idempotent

PRODUCERS = st.integers(min_value=1, max_value=6)
OPERATIONS = st.one_of(
    st.tuples(st.just("data"), PRODUCERS, st.booleans()),  # transactional or not
    st.tuples(st.just("marker"), PRODUCERS, st.booleans()),  # commit or abort
    st.tuples(st.just("bump"), PRODUCERS, st.just(False)),  # a new epoch
    st.tuples(st.just("expire"), PRODUCERS, st.just(False)),  # a clock jump that expires idle producers
    st.tuples(st.just("snapshot"), PRODUCERS, st.just(False)),  # a restart from a snapshot
)


def _scanned(state: ProducerStateManager) -> int | None:
    return min(
        (e.current_txn_first_offset for e in state.entries() if e.current_txn_first_offset >= 0), default=None
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(OPERATIONS, max_size=60))
def test_first_unstable_offset_is_the_scan_of_every_producer(operations: list[tuple[str, int, bool]]) -> None:
    state = ProducerStateManager()
    epochs: dict[int, int] = {}
    sequences: dict[int, int] = {}
    end, now = 0, 0
    with tempfile.TemporaryDirectory() as directory:
        for kind, producer_id, flag in operations:
            now += 1
            epoch = epochs.setdefault(producer_id, 0)
            if kind == "data":
                sequence = sequences.get(producer_id, 0)
                batch = idempotent(
                    producer_id, epoch, sequence, count=2, attributes=TRANSACTIONAL if flag else 0
                )
                state.update(parse_batch_header(batch), end, now)
                sequences[producer_id] = sequence + 2
                end += 2
            elif kind == "marker":
                state.update(
                    parse_batch_header(encode_control_batch(producer_id, epoch, flag, 0, now)), end, now
                )
                end += 1
            elif kind == "bump":
                epochs[producer_id] = epoch + 1
                sequences[producer_id] = 0
            elif kind == "expire":
                now += 1000
                state.remove_expired(now, 1000)
            else:
                state.take_snapshot(Path(directory), end)
                state = ProducerStateManager()
                assert state.load_latest_snapshot(Path(directory), end) == end
            assert state.first_unstable_offset() == _scanned(state)


def test_many_short_transactions_behind_a_long_one_keep_the_index_small() -> None:
    """Ended transactions below a hanging one are dropped from the heap, not kept forever."""
    state = ProducerStateManager()
    state.update(parse_batch_header(idempotent(1, 0, 0, attributes=TRANSACTIONAL)), 0, 0)
    end = 1
    for sequence in range(1000):
        state.update(parse_batch_header(idempotent(2, 0, sequence, attributes=TRANSACTIONAL)), end, 0)
        state.update(parse_batch_header(encode_control_batch(2, 0, True, 0, 0)), end + 1, 0)
        end += 2
        assert state.first_unstable_offset() == 0
    assert len(state._ongoing_heap) <= 20
