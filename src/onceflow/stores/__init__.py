"""Exactly-once output to a database: a micro-batch's results and the query's progress (batch id and
end offsets) commit in one transaction, and a batch the query already applied is skipped.

    with open_store("results.db") as store:  # or "sqlite:///results.db", "postgresql://user@host:5432/db"
        store.apply_batch("query-1", 7, {"payments": {"0": 1200}}, {"alice": 500, "bob": -500})
"""

from __future__ import annotations

from onceflow.stores.base import BatchStore, Progress, StoreError, Transaction, WriteRows
from onceflow.stores.sqlite import SQLiteStore

__all__ = [
    "BatchStore",
    "Progress",
    "SQLiteStore",
    "StoreError",
    "Transaction",
    "WriteRows",
    "open_store",
]


def open_store(target: str) -> BatchStore:
    """A store for a SQLite file path, a `sqlite:///path` URL or a `postgresql://` URL."""
    if target.startswith(("postgresql://", "postgres://")):
        # Imported here: psycopg comes with the `postgres` extra, SQLite needs nothing.
        from onceflow.stores.postgres import PostgresStore

        return PostgresStore(target)
    path = target.removeprefix("sqlite:///")
    if not path or "://" in path or path.startswith("sqlite:"):
        raise StoreError(
            f"unknown store target {target!r}: use a SQLite file path, sqlite:///path or postgresql://..."
        )
    return SQLiteStore(path)
