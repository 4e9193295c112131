"""A worker stuck in a client call past its timeout, or whose consumer is fenced for good, exits,
so its supervisor starts it again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, Producer

from onceflow.client_watchdog import STUCK_EXIT_CODE, records_or_exit
from tests.conftest import FAST_JOINS, BrokerProcess, wait_until

PROGRAM = """
import time
from onceflow import client_watchdog
client_watchdog.MARGIN_S = 0.2
with client_watchdog.exit_if_stuck(0.1, "the call"):
    time.sleep({call_s})
print("returned")
"""


def run(call_s: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", PROGRAM.format(call_s=call_s)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_call_stuck_past_its_timeout_ends_the_process_with_one_line() -> None:
    stuck = run(call_s=120)
    assert stuck.returncode == STUCK_EXIT_CODE
    assert stuck.stdout == ""
    assert stuck.stderr == "the call has not returned 0.3 s after it began: exiting\n"


def test_a_call_that_returns_in_time_goes_on() -> None:
    returned = run(call_s=0.01)
    assert (returned.returncode, returned.stdout, returned.stderr) == (0, "returned\n", "")


def test_a_static_member_fenced_by_its_successor_ends_the_process(tmp_path: Path) -> None:
    # A broker of its own process: closing a consumer can wait in a rebalance callback, holding
    # the GIL, for an answer that a broker in this process could then never send.
    broker = BrokerProcess(tmp_path / "data", settings=FAST_JOINS).start()
    try:
        _fence_a_static_member(broker.bootstrap_servers)
    finally:
        broker.kill()


def _fence_a_static_member(bootstrap_servers: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    producer.produce("input", b"record")
    assert producer.flush(30) == 0
    config = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": "workers",
        "group.instance.id": "worker-0",
        "auto.offset.reset": "earliest",
        "heartbeat.interval.ms": 100,
    }
    first, successor = Consumer(config), Consumer(config)
    try:
        first.subscribe(["input"])

        def assigned() -> bool:
            first.consume(10, timeout=0.1)
            return bool(first.assignment())

        wait_until(assigned, timeout_s=60, what="the first member's assignment")
        successor.subscribe(["input"])  # same group.instance.id: it takes the first one's place
        polled: list[Message] = []

        def fenced() -> bool:
            successor.poll(0)
            polled.extend(message for message in first.consume(10, timeout=0.1) if message.error())
            return bool(polled)

        wait_until(fenced, timeout_s=60, what="an error polled by the first member")
        # The precondition: the error is fatal, and not flagged so on the message.
        assert "fenced" in polled[0].error().str() and not polled[0].error().fatal()
        with pytest.raises(SystemExit, match=r"^fatal consumer error: .*fenced"):
            records_or_exit(polled)
    finally:
        first.close()
        successor.close()
