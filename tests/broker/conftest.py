"""Fixtures of the broker tests."""

from __future__ import annotations

from typing import Any

import pytest

from onceflow.apis import fetch


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes each read of the fetch handler found, one entry per read: a long-polling
    fetch reads once when it arrives and again at each wake-up."""
    found: list[int] = []
    original = fetch._read

    def counting(request: Any, topics: Any, session: Any) -> Any:
        result = original(request, topics, session)
        found.append(result[1])
        return result

    monkeypatch.setattr(fetch, "_read", counting)
    return found
