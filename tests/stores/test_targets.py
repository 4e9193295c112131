"""Opening stores: the accepted targets, and readable errors for the rest."""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path

import pytest

from onceflow.stores import SQLiteStore, StoreError, open_store
from onceflow.stores.postgres import PostgresStore
from tests.postgres import PostgresServer, free_port


def test_a_path_and_a_sqlite_url_open_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    with open_store(str(path)) as store:
        assert isinstance(store, SQLiteStore)
        store.apply_batch("q", 0, {}, {"a": 1})
    with open_store(f"sqlite:///{path}") as store:
        assert store.balances() == {"a": 1}


def test_sqlite_is_in_wal_mode(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "results.db")):
        pass
    connection = sqlite3.connect(tmp_path / "results.db")
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        connection.close()


def open_together(path: Path, openers: int) -> list[StoreError]:
    """Opens `path` from several threads released at the same moment; returns their errors."""
    start = threading.Barrier(openers)
    errors: list[StoreError] = []

    def open_it() -> None:
        start.wait()
        try:
            SQLiteStore(path).close()
        except StoreError as error:
            errors.append(error)

    threads = [threading.Thread(target=open_it) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_openers_racing_to_create_one_sqlite_file_all_open_it(tmp_path: Path) -> None:
    # Switching a new file to WAL mode while another connection does the same can fail with
    # "database is locked" at once, without SQLite's busy timeout: seen a few times in 200 rounds.
    for attempt in range(300):
        assert open_together(tmp_path / f"new-{attempt}.db", openers=6) == [], f"round {attempt}"


@pytest.mark.postgres
def test_a_postgresql_url_opens_postgresql(postgres_server: PostgresServer) -> None:
    with open_store(postgres_server.create_database("targets")) as store:
        assert isinstance(store, PostgresStore)
        assert store.balances() == {}


@pytest.mark.parametrize("target", ["mysql://root@localhost/db", "sqlite://results.db", "sqlite:///", ""])
def test_an_unknown_target_is_refused(target: str) -> None:
    with pytest.raises(StoreError, match="sqlite:///path or postgresql://"):
        open_store(target)


def test_a_missing_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(
        StoreError, match=r"cannot open SQLite database .*/missing/results\.db: unable to open"
    ):
        open_store(str(tmp_path / "missing" / "results.db"))


def test_a_file_that_is_not_a_database_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database, just some text that is long enough to fill a header page\n" * 20)
    with pytest.raises(StoreError, match="not a database"):
        open_store(str(path))


def test_an_unreachable_server_is_reported_without_its_password() -> None:
    target = f"postgresql://app:secret@127.0.0.1:{free_port()}/results"
    shown = re.escape("cannot connect to PostgreSQL at postgresql://app:***@127.0.0.1")
    with pytest.raises(StoreError, match=shown) as raised:
        open_store(target)
    assert "secret" not in str(raised.value)
