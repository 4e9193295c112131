"""A connection's replies: at most MAX_IN_FLIGHT_PER_CONNECTION under way, none written to a
client that left, none piling up for a client that reads none, and none holding up the
broker's stop."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from onceflow import EmbeddedBroker, server
from tests.conftest import wait_until
from tests.wire import WireClient, fetch_fields


def test_pipelined_requests_past_the_limit_wait_in_the_socket(tmp_path: Path, reads: list[int]) -> None:
    """200 long polls in one write: 64 start, the rest wait until answers make room."""
    limit = server.MAX_IN_FLIGHT_PER_CONNECTION
    with EmbeddedBroker(tmp_path) as broker:
        with WireClient(broker.bootstrap_servers) as client:
            client.create_topic("quiet", 1)
        with WireClient(broker.bootstrap_servers) as pipelining:
            pipelining.send_raw(
                b"".join(
                    pipelining.fetch_frame({"quiet": [0]}, max_wait=30_000, min_bytes=1) for _ in range(200)
                )
            )
            wait_until(lambda: len(reads) >= limit, timeout_s=10)
            # A request on another connection goes round the loop after the 64 have started.
            with WireClient(broker.bootstrap_servers) as client:
                assert client.list_offset("quiet", 0) == 0
            assert len(reads) == limit


def test_the_broker_stops_without_waiting_for_long_polls(tmp_path: Path, reads: list[int]) -> None:
    """A connection with its replies full (70 long polls of 60 s pipelined) does not hold up a
    stop: the stop ends the connection without waiting for them."""
    broker = EmbeddedBroker(tmp_path).start()
    try:
        with WireClient(broker.bootstrap_servers) as client:
            client.create_topic("quiet", 1)
        waiting = WireClient(broker.bootstrap_servers)
        waiting.send_raw(
            b"".join(waiting.fetch_frame({"quiet": [0]}, max_wait=60_000, min_bytes=1) for _ in range(70))
        )
        wait_until(lambda: len(reads) == server.MAX_IN_FLIGHT_PER_CONNECTION, timeout_s=10)
    finally:
        started = time.monotonic()
        broker.stop()
    assert time.monotonic() - started < 10  # 60 s, the long polls' wait, before the fix
    waiting.close()


def test_answers_for_a_client_that_left_are_dropped_quietly(
    tmp_path: Path, reads: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """A client closes its connection while ten fetches long-poll. Their answers fall due
    together; once the first write finds the connection gone the rest are dropped, not written
    (asyncio warns about every write to a lost connection past the fifth), and the broker goes
    on serving."""
    with EmbeddedBroker(tmp_path) as broker:
        with WireClient(broker.bootstrap_servers) as client:
            client.create_topic("quiet", 1)
        with WireClient(broker.bootstrap_servers) as leaving:
            leaving.send_raw(
                b"".join(leaving.fetch_frame({"quiet": [0]}, max_wait=300, min_bytes=1) for _ in range(10))
            )
            wait_until(lambda: len(reads) == 10, timeout_s=10)  # all ten wait
        wait_until(lambda: len(reads) >= 20, timeout_s=10)  # each read again at its deadline
        with WireClient(broker.bootstrap_servers) as client:  # the loop went past their answers
            assert client.list_offset("quiet", 0) == 0
    assert "socket.send() raised exception" not in caplog.text


def test_a_client_that_reads_no_answers_stops_being_read(tmp_path: Path, reads: list[int]) -> None:
    """120 fetches of 1 MB answers pipelined by a client that reads nothing: once the sockets'
    buffers are full the broker stops answering them, then stops reading the socket, instead of
    keeping megabytes of answers in memory; once the client reads, every answer comes, in order."""
    pipelined = 120
    with EmbeddedBroker(tmp_path) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 50})
        for _ in range(1000):
            producer.produce("large", bytes(1000))
        assert producer.flush(30) == 0
        with WireClient(broker.bootstrap_servers) as silent:
            frames = [silent.frame(1, 12, **fetch_fields({"large": [0]}, 12)) for _ in range(pipelined)]
            silent.send_raw(b"".join(frame for _, frame in frames))
            wait_until(lambda: len(reads) >= 1, timeout_s=10)
            with WireClient(broker.bootstrap_servers) as other:  # the loop goes round meanwhile
                for _ in range(3):
                    assert other.list_offset("large", 0) == 1000
            assert len(reads) < pipelined / 2  # 120 when answers pile up in the broker (control)
            for correlation_id, _ in frames:
                answer = silent.read_response(1, 12, correlation_id)
                assert len(answer.responses[0].partitions[0].records) > 900_000
        assert len(reads) == pipelined
