"""Every store test runs against a fresh SQLite file and a fresh database on a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from onceflow.stores import BatchStore, open_store


@pytest.fixture
def target(database: str) -> str:
    return database


@pytest.fixture
def store(target: str) -> Iterator[BatchStore]:
    with open_store(target) as opened:
        yield opened
