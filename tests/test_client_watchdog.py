"""A worker stuck in a client call past its timeout, or whose consumer is fenced for good, exits,
so its supervisor starts it again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from onceflow.client_watchdog import STUCK_EXIT_CODE
from tests.conftest import FAST_JOINS, BrokerProcess

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
    # The consumers run in a process of their own, which leaves without closing them: librdkafka
    # can wait for ever in a consumer's close after a fencing (in a rebalance callback, holding
    # the GIL), and the broker runs apart for the same reason.
    broker = BrokerProcess(tmp_path / "data", settings=FAST_JOINS).start()
    try:
        fencing = subprocess.run(
            [sys.executable, "-c", FENCING, broker.bootstrap_servers],
            capture_output=True,
            text=True,
            timeout=150,
        )
    finally:
        broker.kill()
    assert fencing.returncode == 0, fencing.stdout + fencing.stderr
    polled, flagged_fatal, exit_message = fencing.stdout.splitlines()[-3:]
    # The precondition: the error is fatal, and not flagged so on the message.
    assert "fenced" in polled and flagged_fatal == "False", fencing.stdout
    assert exit_message.startswith("fatal consumer error: ") and "fenced" in exit_message


# A static member, then its successor with the same group.instance.id, which takes its place: the
# first member's poll returns the fencing error, which `records_or_exit` ends the process on.
FENCING = """
import os, sys, time
from confluent_kafka import Consumer, Producer
from onceflow.client_watchdog import records_or_exit

bootstrap_servers = sys.argv[1]
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


def until(condition, what):
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what


def assigned():
    first.consume(10, timeout=0.1)
    return first.assignment()


first, successor = Consumer(config), Consumer(config)
first.subscribe(["input"])
until(assigned, "the first member's assignment")
successor.subscribe(["input"])
polled = []


def fenced():
    successor.poll(0)
    polled.extend(message for message in first.consume(10, timeout=0.1) if message.error())
    return polled


until(fenced, "an error polled by the first member")
print(polled[0].error().str())
print(polled[0].error().fatal())
try:
    records_or_exit(polled)
    print("went on")
except SystemExit as leaving:
    print(leaving)
sys.stdout.flush()
os._exit(0)  # without closing the consumers
"""
