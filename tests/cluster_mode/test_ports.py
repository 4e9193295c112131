"""A broker's first port: taken by another process between its pick and the broker's bind, the
start goes on with another port; any other failure is not retried."""

from __future__ import annotations

import socket

import pytest

from onceflow.cluster.ports import in_use, start_on_a_restartable_port


def test_a_port_taken_before_the_bind_is_traded_for_another() -> None:
    tried: list[int] = []
    with socket.socket() as thief:

        def start(port: int) -> int:
            tried.append(port)
            if len(tried) == 1:  # another process binds the picked port first
                thief.bind(("127.0.0.1", port))
                raise RuntimeError(f"address already in use: {port}")
            return port

        started_on = start_on_a_restartable_port(start)
        assert in_use(tried[0])
    assert len(tried) == 2 and started_on == tried[1] != tried[0]


def test_a_failure_on_a_free_port_is_raised_at_once() -> None:
    tried: list[int] = []

    def start(port: int) -> int:
        tried.append(port)
        raise RuntimeError("bad configuration")

    with pytest.raises(RuntimeError, match="bad configuration"):
        start_on_a_restartable_port(start)
    assert len(tried) == 1


def test_a_port_taken_on_every_attempt_fails_after_the_last() -> None:
    thieves: list[socket.socket] = []

    def start(port: int) -> int:
        thief = socket.socket()
        thieves.append(thief)
        thief.bind(("127.0.0.1", port))
        raise RuntimeError("address already in use")

    try:
        with pytest.raises(RuntimeError, match="already in use"):
            start_on_a_restartable_port(start, attempts=3)
    finally:
        for thief in thieves:
            thief.close()
    assert len(thieves) == 3
