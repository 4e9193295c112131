"""The embedded store: one SQLite file in WAL mode."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from onceflow.stores.base import BatchStore, CursorTransaction, StoreError, Transaction

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS query_progress (
        query_id TEXT PRIMARY KEY,
        batch_id INTEGER NOT NULL,
        end_offsets TEXT NOT NULL,
        applied_at TEXT NOT NULL
    ) STRICT""",
    """CREATE TABLE IF NOT EXISTS balances (
        account TEXT PRIMARY KEY,
        balance INTEGER NOT NULL,
        updated_batch INTEGER NOT NULL
    ) STRICT""",
)


class SQLiteStore(BatchStore):
    """Writers take the database's write lock up front (BEGIN IMMEDIATE), so concurrent appliers
    of one batch, in any process, run one after the other and the second finds the batch applied."""

    def __init__(self, path: str | Path, busy_timeout_s: float = 60.0) -> None:
        super().__init__(str(path))
        self._busy_timeout_s = busy_timeout_s
        try:
            self._conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as error:
            raise StoreError(f"cannot open SQLite database {self.target}: {error}") from error
        try:
            self._prepare()
        except BaseException:
            self._conn.close()
            raise

    def _prepare(self) -> None:
        try:
            mode = self._enter_wal_mode()
            # FULL syncs the WAL at every commit: a commit the caller saw survives a power cut.
            self._conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as error:
            raise StoreError(f"cannot open SQLite database {self.target}: {error}") from error
        if mode != "wal":
            raise StoreError(f"SQLite database {self.target} cannot use WAL mode (journal mode is {mode})")
        with self._transaction() as tx:
            for statement in SCHEMA:
                tx.execute(statement)

    def _enter_wal_mode(self) -> str:
        """Switching to WAL needs the database to itself, and SQLite answers SQLITE_BUSY at once,
        without its busy handler, when another process is opening the same new file: retry."""
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                (mode,) = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()
                return str(mode)
            except sqlite3.OperationalError as error:
                if error.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[Transaction]:
        try:
            cursor = self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield CursorTransaction(cursor)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.rollback()
                raise
        except sqlite3.Error as error:
            raise StoreError(f"SQLite database {self.target}: {error}") from error

    def _query(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as error:
            raise StoreError(f"SQLite database {self.target}: {error}") from error

    def _timestamp(self, moment: datetime) -> object:
        return moment.isoformat()
