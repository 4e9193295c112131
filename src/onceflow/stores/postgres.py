"""The server store: PostgreSQL through psycopg 3."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from onceflow.extras import MissingExtraError

try:
    import psycopg
except ImportError as error:
    raise MissingExtraError("onceflow's PostgreSQL store", "psycopg", "postgres") from error

from onceflow.stores.base import BatchStore, CursorTransaction, StoreError, Transaction

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS query_progress (
        query_id TEXT PRIMARY KEY,
        batch_id BIGINT NOT NULL,
        end_offsets TEXT NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS balances (
        account TEXT PRIMARY KEY,
        balance BIGINT NOT NULL,
        updated_batch BIGINT NOT NULL
    )""",
)

# CREATE TABLE IF NOT EXISTS is not safe against itself in two sessions; this lock serializes them.
SCHEMA_LOCK = 0x0CEF10


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def psycopg_sql(sql: str) -> str:
    """`?` placeholders as psycopg's `%s`."""
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresTransaction(CursorTransaction):
    def driver_sql(self, sql: str) -> str:
        return psycopg_sql(sql)


class PostgresStore(BatchStore):
    """Concurrent appliers of one batch serialize on the query's progress row, which claiming the batch
    inserts or updates first; the second sees the first's commit and skips the batch."""

    def __init__(self, url: str, connect_timeout_s: int = 10) -> None:
        super().__init__(redacted(url))
        try:
            self._conn: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(
                url, autocommit=True, connect_timeout=connect_timeout_s
            )
        except psycopg.Error as error:
            raise StoreError(f"cannot connect to PostgreSQL at {self.target}: {error}") from error
        try:
            with self._transaction() as tx:
                tx.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
                for statement in SCHEMA:
                    tx.execute(statement)
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[Transaction]:
        try:
            with self._conn.transaction(), self._conn.cursor() as cursor:
                yield PostgresTransaction(cursor)
        except psycopg.Error as error:
            raise StoreError(f"PostgreSQL at {self.target}: {error}") from error

    def _query(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        try:
            with self._conn.cursor() as cursor:
                return cursor.execute(psycopg_sql(sql), params).fetchall()
        except psycopg.Error as error:
            raise StoreError(f"PostgreSQL at {self.target}: {error}") from error

    def _timestamp(self, moment: datetime) -> object:
        return moment
