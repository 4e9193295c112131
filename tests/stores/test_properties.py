"""Any sequence of batches, with replays, reordering and failed attempts, adds up to the batches that
moved the query's progress forward, each once."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.stores import BatchStore, Transaction


@dataclass(frozen=True)
class Attempt:
    batch_id: int
    fails: bool  # the attempt dies inside its transaction, like a lost task


@dataclass(frozen=True)
class Run:
    deltas: dict[int, dict[str, int]]  # a batch carries the same deltas on every attempt
    attempts: list[Attempt]


@st.composite
def runs(draw: st.DrawFn) -> Run:
    batches = draw(st.integers(1, 8))
    account_deltas = st.dictionaries(st.sampled_from("abcd"), st.integers(-(10**12), 10**12), max_size=4)
    deltas = {batch_id: draw(account_deltas) for batch_id in range(batches)}
    attempt = st.builds(Attempt, st.integers(0, batches - 1), st.sampled_from([False, False, False, True]))
    return Run(deltas, draw(st.lists(attempt, min_size=1, max_size=25)))


class LostTask(Exception):
    pass


def lose(tx: Transaction) -> None:
    raise LostTask


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=runs())
def test_balances_are_the_sum_of_the_batches_applied_in_order(store: BatchStore, run: Run) -> None:
    # Examples share the store, so each has its own query and accounts.
    query_id = uuid.uuid4().hex
    prefix = f"{query_id}-"
    progress = -1
    expected: dict[str, int] = {}
    for attempt in run.attempts:
        deltas = {prefix + account: delta for account, delta in run.deltas[attempt.batch_id].items()}
        if attempt.fails:
            with contextlib.suppress(LostTask):
                store.apply_batch(query_id, attempt.batch_id, {"p": attempt.batch_id}, deltas, write=lose)
            continue
        fresh = attempt.batch_id > progress
        assert store.apply_batch(query_id, attempt.batch_id, {"p": attempt.batch_id}, deltas) == fresh
        if fresh:
            progress = attempt.batch_id
            for account, delta in deltas.items():
                expected[account] = expected.get(account, 0) + delta

    assert {a: b for a, b in store.balances().items() if a.startswith(prefix)} == expected
    stored = store.progress(query_id)
    if progress < 0:
        assert stored is None
    else:
        assert stored is not None and (stored.batch_id, stored.end_offsets) == (progress, {"p": progress})
