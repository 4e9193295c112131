"""Every store test runs against a fresh SQLite file and a fresh database on a real PostgreSQL server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.stores import BatchStore, open_store
from tests.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    # Looked up here so that a run of only the SQLite cases starts no server.
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"test_{uuid.uuid4().hex[:16]}")


@pytest.fixture
def store(target: str) -> Iterator[BatchStore]:
    with open_store(target) as opened:
        yield opened
