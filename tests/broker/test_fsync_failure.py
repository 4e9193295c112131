"""A failed fsync halts the broker before it acknowledges anything that fsync was to cover.

After a failed fsync Linux may mark the pages it could not write clean and report the error
once: a second fsync then succeeds without them. So the broker does not try again; it halts, as
Kafka does when its only log directory fails, and a restart recovers from what is on disk. The
failpoint `flush.eio-once` fails the process's first partition flush with EIO, as a disk would,
and lets the later ones succeed, as the kernel would: a broker that retried would acknowledge.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess
from tests.wire import WireClient, make_batch, produce

FAILING_FLUSH = {"ONCEFLOW_FAILPOINTS": "flush.eio-once"}


def test_the_broker_process_halts_with_one_line_and_restarts_from_its_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir)
    broker.start()  # no failpoint: creating the topic flushes nothing
    with WireClient(broker.bootstrap_servers) as client:
        assert client.create_topic("t", 1) == 0
    broker.terminate()

    command = [sys.executable, "-m", "onceflow.cli", "broker", "--listen", f"127.0.0.1:{broker.port}"]
    failing = subprocess.Popen(
        [*command, "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **FAILING_FLUSH},
    )
    try:
        assert failing.stdout is not None and "listening on" in failing.stdout.readline()
        with WireClient(broker.bootstrap_servers) as client, pytest.raises(OSError):
            produce(client, "t", 0, make_batch([b"never acknowledged"]), acks=-1)
        assert failing.wait(timeout=30) == 1
        assert failing.stderr is not None
        lines = failing.stderr.read().strip().splitlines()
    finally:
        failing.kill()
        failing.wait()
    # The last line names the partition whose fsync failed: the produce's, not another flush.
    assert lines[-1].startswith(f"onceflow broker: halted: fsync of {data_dir / 't-0'} failed"), lines

    broker.start()
    try:
        with WireClient(broker.bootstrap_servers) as client:
            assert produce(client, "t", 0, make_batch([b"after the restart"]), acks=-1).error_code == 0
    finally:
        broker.terminate()


def test_an_embedded_broker_stops_serving_and_says_why() -> None:
    script = textwrap.dedent(
        """
        from onceflow import EmbeddedBroker
        from tests.wire import WireClient, make_batch, produce

        broker = EmbeddedBroker().start()
        with WireClient(broker.bootstrap_servers) as client:
            assert client.create_topic("t", 1) == 0
            try:
                produce(client, "t", 0, make_batch([b"never acknowledged"]), acks=-1)
            except OSError:
                pass
            else:
                raise AssertionError("a produce was answered after its fsync failed")
        assert broker.storage_failure is not None and "/t-0 failed" in broker.storage_failure
        broker.stop()  # returns: the halted broker's loop has ended
        print("halted:", broker.storage_failure)
        """
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **FAILING_FLUSH},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "Input/output error" in ran.stdout
