"""Applying batches once: replays, out-of-order batches, extra rows, failed attempts."""

from __future__ import annotations

import pytest

from onceflow.stores import BatchStore, StoreError, Transaction, open_store
from tests.stores.applier import batch_deltas, batch_offsets, total

QUERY = "query-1"


def apply(store: BatchStore, batch_id: int) -> bool:
    return store.apply_batch(QUERY, batch_id, batch_offsets(batch_id), batch_deltas(batch_id))


def test_a_replayed_batch_is_applied_once(store: BatchStore) -> None:
    assert store.progress(QUERY) is None
    assert apply(store, 0)
    assert not apply(store, 0)
    assert store.balances() == total([0])
    progress = store.progress(QUERY)
    assert progress is not None
    assert (progress.batch_id, progress.end_offsets) == (0, batch_offsets(0))


def test_a_batch_at_or_before_the_progress_is_skipped(store: BatchStore) -> None:
    assert apply(store, 0)
    assert apply(store, 2)
    assert not apply(store, 1)
    assert not apply(store, 2)
    assert apply(store, 3)
    assert store.balances() == total([0, 2, 3])
    progress = store.progress(QUERY)
    assert progress is not None
    assert (progress.batch_id, progress.end_offsets) == (3, batch_offsets(3))


def test_queries_keep_their_own_progress(store: BatchStore) -> None:
    assert store.apply_batch("a", 5, {}, {"x": 1})
    assert store.apply_batch("b", 0, {}, {"x": 10})
    assert not store.apply_batch("a", 5, {}, {"x": 1})
    assert store.balances() == {"x": 11}
    assert [p.batch_id for p in (store.progress("a"), store.progress("b")) if p] == [5, 0]


def test_progress_survives_reopening(target: str) -> None:
    with open_store(target) as store:
        assert apply(store, 0)
    with open_store(target) as store:
        assert not apply(store, 0)
        assert store.balances() == total([0])


def test_end_offsets_are_stored_as_deterministic_json(store: BatchStore) -> None:
    stored: list[str] = []

    def read_back(tx: Transaction) -> None:
        [(text,)] = tx.execute("SELECT end_offsets FROM query_progress WHERE query_id = ?", (QUERY,))
        stored.append(text)

    assert store.apply_batch(QUERY, 0, {"t": {"1": 2, "0": 1}, "s": 3}, {}, write=read_back)
    assert store.apply_batch(QUERY, 1, {"s": 3, "t": {"0": 1, "1": 2}}, {}, write=read_back)
    assert stored == ['{"s":3,"t":{"0":1,"1":2}}'] * 2


def test_extra_rows_are_written_with_the_batch_and_only_once(store: BatchStore) -> None:
    calls = 0

    def write(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        tx.execute("CREATE TABLE IF NOT EXISTS events (id TEXT PRIMARY KEY, amount INTEGER)")
        tx.executemany("INSERT INTO events VALUES (?, ?)", [("e1", 5), ("e2", -5)])

    assert store.apply_batch(QUERY, 0, {}, {"a": 5}, write=write)
    assert not store.apply_batch(QUERY, 0, {}, {"a": 5}, write=write)
    assert calls == 1

    rows: list[tuple[object, ...]] = []
    store.apply_batch(QUERY, 1, {}, {}, write=lambda tx: rows.extend(tx.execute("SELECT * FROM events")))
    assert sorted(rows) == [("e1", 5), ("e2", -5)]


def test_a_failed_attempt_changes_nothing_and_can_be_retried(store: BatchStore) -> None:
    assert apply(store, 0)

    def fail(tx: Transaction) -> None:
        raise RuntimeError("task lost")

    with pytest.raises(RuntimeError, match="task lost"):
        store.apply_batch(QUERY, 1, batch_offsets(1), batch_deltas(1), write=fail)
    with pytest.raises(StoreError):
        store.apply_batch(QUERY, 1, batch_offsets(1), batch_deltas(1), write=lambda tx: tx.execute("BOGUS"))
    progress = store.progress(QUERY)
    assert progress is not None and progress.batch_id == 0
    assert store.balances() == total([0])

    assert apply(store, 1)
    assert store.balances() == total([0, 1])


def test_deltas_must_be_integer_cents_and_batch_ids_not_negative(store: BatchStore) -> None:
    with pytest.raises(TypeError, match="cents"):
        store.apply_batch(QUERY, 0, {}, {"a": 1.5})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=">= 0"):
        store.apply_batch(QUERY, -1, {}, {"a": 1})
    assert store.progress(QUERY) is None
    assert store.balances() == {}
