"""EmbeddedBroker's start and stop, also where they go wrong: a second start of a running broker
used to replace its event loop with the failed attempt's, so that stop() raised "Event loop is
closed" and the first broker ran on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from confluent_kafka import Producer

from onceflow import EmbeddedBroker
from onceflow.log.errors import DataDirLockedError


def accepts(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        return False
    return True


def delivered(bootstrap: str, value: bytes) -> bool:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    outcome: list[object] = []
    producer.produce("lifecycle", value, on_delivery=lambda error, _: outcome.append(error))
    producer.flush(30)
    return outcome == [None]


def test_a_second_start_is_refused_and_the_running_broker_still_stops(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path).start()
    address = broker.bootstrap_servers
    with pytest.raises(RuntimeError, match="already running"):
        broker.start()
    assert broker.bootstrap_servers == address and delivered(address, b"still serving")
    broker.stop()
    assert not accepts(address)


def test_a_failed_start_holds_nothing_and_the_broker_can_start_later(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path):
        blocked = EmbeddedBroker(tmp_path)  # the same data directory, still in use
        with pytest.raises(DataDirLockedError):
            blocked.start()
        blocked.stop()  # nothing to stop: no error
    restarted = EmbeddedBroker(tmp_path).start()
    try:
        assert delivered(restarted.bootstrap_servers, b"after the first stopped")
        restarted.stop()
        again = restarted.start()  # the same object, after its stop
        assert delivered(again.bootstrap_servers, b"started twice")
    finally:
        restarted.stop()
