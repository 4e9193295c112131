"""The backend-neutral half of a batch store: the apply-once protocol and the SQL both databases share."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol


class StoreError(Exception):
    """A store cannot be opened or a database operation failed; the message names the store."""


@dataclass(frozen=True)
class Progress:
    """The last batch a query applied, as committed with its results."""

    batch_id: int
    end_offsets: dict[str, Any]
    applied_at: datetime


class Transaction(Protocol):
    """The open transaction of `apply_batch`, for writing extra rows along with the batch.

    SQL uses `?` placeholders on every backend, so a literal `?` must be passed as a parameter.
    """

    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None: ...


WriteRows = Callable[[Transaction], object]  # what it returns is ignored

# Claiming the batch first locks the query's progress row (or, for its first batch, the key) until
# commit, so a concurrent applier of the same batch waits and then finds it applied.
CLAIM_BATCH = """
INSERT INTO query_progress (query_id, batch_id, end_offsets, applied_at) VALUES (?, ?, ?, ?)
ON CONFLICT (query_id) DO UPDATE
SET batch_id = excluded.batch_id, end_offsets = excluded.end_offsets, applied_at = excluded.applied_at
WHERE query_progress.batch_id < excluded.batch_id
RETURNING batch_id
"""

ADD_BALANCE = """
INSERT INTO balances (account, balance, updated_batch) VALUES (?, ?, ?)
ON CONFLICT (account) DO UPDATE
SET balance = balances.balance + excluded.balance, updated_batch = excluded.updated_batch
"""

SELECT_PROGRESS = "SELECT batch_id, end_offsets, applied_at FROM query_progress WHERE query_id = ?"
SELECT_BALANCES = "SELECT account, balance FROM balances"


def offsets_json(end_offsets: Mapping[str, Any]) -> str:
    """Deterministic JSON, since Spark compares offsets as strings."""
    return json.dumps(end_offsets, sort_keys=True, separators=(",", ":"))


class BatchStore(ABC):
    """Results of a streaming query's micro-batches, each committed with the query's progress.

    Tables: `query_progress(query_id, batch_id, end_offsets, applied_at)` and
    `balances(account, balance, updated_batch)` with balances in integer cents.
    """

    def __init__(self, target: str) -> None:
        self.target = target  # for messages: a URL's password is hidden, so it may not reopen the store

    def apply_batch(
        self,
        query_id: str,
        batch_id: int,
        end_offsets: Mapping[str, Any],
        balance_deltas: Mapping[str, int],
        write: WriteRows | None = None,
    ) -> bool:
        """Apply a batch once: add `balance_deltas`, run `write`, and record the batch as the query's
        progress, all in one transaction. Returns False, changing nothing, if the query already
        applied this batch or a later one."""
        if batch_id < 0:
            raise ValueError(f"batch id must be >= 0, not {batch_id}")
        for account, delta in balance_deltas.items():
            if not isinstance(delta, int) or isinstance(delta, bool):
                raise TypeError(f"balance delta for {account!r} must be an int (cents), not {delta!r}")
        # One account order for every applier, so concurrent batches cannot deadlock on balance rows.
        rows = [(account, balance_deltas[account], batch_id) for account in sorted(balance_deltas)]
        claim = (query_id, batch_id, offsets_json(end_offsets), self._timestamp(datetime.now(UTC)))
        with self._transaction() as tx:
            if not tx.execute(CLAIM_BATCH, claim):
                return False
            tx.executemany(ADD_BALANCE, rows)
            if write is not None:
                write(tx)
        return True

    def progress(self, query_id: str) -> Progress | None:
        rows = self._query(SELECT_PROGRESS, (query_id,))
        if not rows:
            return None
        batch_id, end_offsets, applied_at = rows[0]
        if not isinstance(applied_at, datetime):
            applied_at = datetime.fromisoformat(applied_at)
        return Progress(batch_id, json.loads(end_offsets), applied_at)

    def balances(self) -> dict[str, int]:
        return {account: int(balance) for account, balance in self._query(SELECT_BALANCES, ())}

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Transaction]:
        """A write transaction that commits on success and rolls back on any exception."""

    @abstractmethod
    def _query(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """One read statement outside any batch transaction."""

    @abstractmethod
    def _timestamp(self, moment: datetime) -> object:
        """`moment` as the backend's applied_at column takes it."""

    def __enter__(self) -> BatchStore:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"


class CursorTransaction:
    """A `Transaction` over a DB-API cursor whose driver takes `?` placeholders."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        self._cursor.execute(self.driver_sql(sql), params)
        if self._cursor.description is None:
            return []
        return list(self._cursor.fetchall())

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        self._cursor.executemany(self.driver_sql(sql), rows)

    def driver_sql(self, sql: str) -> str:
        return sql
