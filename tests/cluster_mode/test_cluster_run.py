"""`onceflow cluster run` as an operator uses it: in its own process, read through its output,
used by a real client, stopped with SIGTERM."""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from onceflow.cluster import launcher
from onceflow.cluster.errors import ClusterError
from onceflow.cluster.launcher import RESTART_PREFIX
from onceflow.cluster.zk import read_cluster
from onceflow.cluster.zookeeper_server import ZooKeeperServer
from tests.cli.commands import onceflow
from tests.conftest import wait_until

BROKER_LINE = re.compile(r"broker (\d+) pid (\d+) listening on (127\.0\.0\.1:\d+)")


@dataclass
class RunningCommand:
    """A process whose stdout lines arrive on a queue, so that waits on them are bounded."""

    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no {text!r} in {self.seen}") from None
            self.seen.append(line)
            if text in line:
                return line


def start(command: list[str]) -> RunningCommand:
    return RunningCommand(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def cluster_run(tmp_path: Path) -> Iterator[RunningCommand]:
    command = [sys.executable, "-m", "onceflow.cli", "cluster", "run", "--brokers", "3"]
    running = start([*command, "--data-dir", str(tmp_path / "cluster")])
    yield running
    if running.process.poll() is None:  # the test failed before its SIGTERM
        running.process.terminate()
        running.process.wait(timeout=60)


@pytest.mark.zookeeper
def test_cluster_run_serves_clients_restarts_a_broker_from_its_log_and_stops_on_sigterm(
    cluster_run: RunningCommand, tmp_path: Path
) -> None:
    zookeeper = cluster_run.wait_for("zookeeper pid").rsplit(" ", 1)[1]
    bootstrap = cluster_run.wait_for("cluster ready: bootstrap ").rsplit(" ", 1)[1]
    brokers = [BROKER_LINE.fullmatch(line) for line in cluster_run.seen if line.startswith("broker ")]
    assert [(match.group(1), match.group(3)) for match in brokers if match] == list(
        zip(["1", "2", "3"], bootstrap.split(","), strict=True)
    )
    pids = [int(match.group(2)) for match in brokers if match]
    # Below the ephemeral range, so that no client connection takes a killed broker's port.
    lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(int(address.rsplit(":", 1)[1]) < lowest_ephemeral for address in bootstrap.split(","))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for index in range(5):
        producer.produce("runs", value=b"%d" % index)
    assert producer.flush(30) == 0
    del producer  # nothing left to send: no reconnect attempts once the cluster stops
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "run-readers", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe(["runs"])
    read: list[bytes] = []
    wait_until(
        lambda: read.extend(m.value() for m in consumer.consume(5, 0.5) if not m.error()) or len(read) >= 5
    )
    consumer.close()
    assert sorted(read) == [b"%d" % index for index in range(5)]

    # A killed broker: the command says so, and its log's first line starts it again.
    os.kill(pids[2], signal.SIGKILL)
    cluster_run.wait_for("exited with code")
    first_line = (tmp_path / "cluster" / "broker-3.log").read_text().splitlines()[0]
    assert first_line.startswith(RESTART_PREFIX)
    wait_until(lambda: 3 not in read_cluster(zookeeper, 5).brokers, timeout_s=30)  # its session ended
    restarted = start(shlex.split(first_line.removeprefix(RESTART_PREFIX)))
    try:
        assert restarted.wait_for("listening on").endswith(bootstrap.split(",")[2])
        wait_until(lambda: 3 in read_cluster(zookeeper, 5).brokers, timeout_s=30)
    finally:
        restarted.process.terminate()
        restarted.process.wait(timeout=30)

    cluster_run.process.send_signal(signal.SIGTERM)
    assert cluster_run.process.wait(timeout=60) == 0
    cluster_run.wait_for("cluster stopped")
    zookeeper_pid = int(cluster_run.seen[0].split()[2])
    assert all(gone(pid) for pid in [zookeeper_pid, *pids])
    assert not (tmp_path / "cluster" / "zookeeper").exists()


def test_cluster_run_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    no_brokers = onceflow("cluster", "run", "--brokers", "0", "--data-dir", str(tmp_path))
    (tmp_path / "file").touch()
    bad_dir = onceflow("cluster", "run", "--data-dir", str(tmp_path / "file" / "cluster"))
    assert (no_brokers.returncode, no_brokers.stdout) == (2, "")
    assert no_brokers.stderr == "onceflow cluster run: --brokers must be at least 1, got 0\n"
    assert (bad_dir.returncode, bad_dir.stdout) == (1, "")
    assert bad_dir.stderr.startswith("onceflow cluster run: cannot use --data-dir ")
    assert bad_dir.stderr.count("\n") == 1


@pytest.mark.zookeeper
def test_a_start_that_waits_on_the_brokers_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Brokers that never register (none started here): a line a while, then one error that
    says how far they got, instead of a silent minute."""
    monkeypatch.setattr(launcher, "PROGRESS_S", 0.5)
    monkeypatch.setattr(launcher, "START_TIMEOUT_S", 4.0)
    said: list[str] = []
    with ZooKeeperServer() as zookeeper:
        where = f"no onceflow cluster in ZooKeeper at {zookeeper.connect_string}"
        # Answering at all first: in a CI run, a ZooKeeper just started took more than the 2 s
        # this test then allowed to take its first session ("cannot reach ZooKeeper"), and the
        # start failed before a line was due.
        wait_until(lambda: _no_cluster_yet(zookeeper.connect_string), timeout_s=60)
        with pytest.raises(launcher.LaunchError) as refused:
            launcher.wait_registered(zookeeper.connect_string, 3, said.append)
    assert said and set(said) == {f"waiting for the brokers to register in ZooKeeper: {where}"}
    assert str(refused.value) == f"the brokers did not all register in ZooKeeper in 4 s: {where}"


def _no_cluster_yet(zookeeper: str) -> bool:
    """ZooKeeper answers, and holds no cluster."""
    try:
        read_cluster(zookeeper, 5)
    except ClusterError as error:
        return str(error).startswith("no onceflow cluster")
    raise AssertionError(f"a cluster in ZooKeeper at {zookeeper}")


@pytest.mark.zookeeper
def test_cluster_run_with_security_serves_only_the_clients_it_lets_in(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "onceflow.cli",
        "cluster",
        "run",
        "--brokers",
        "2",
        "--security",
        "sasl_ssl",
    ]
    running = start([*command, "--data-dir", str(tmp_path / "cluster")])
    try:
        bootstrap = running.wait_for("cluster ready: bootstrap ").rsplit(" ", 1)[1]
        hint = running.wait_for("clients connect over SASL_SSL")
        properties_path = tmp_path / "cluster" / "security" / "client.properties"
        assert f"--command-config {properties_path}" in hint
        assert properties_path.stat().st_mode & 0o077 == 0  # the admin's password: the owner's only
        properties = dict(line.split("=", 1) for line in properties_path.read_text().splitlines())
        secured = {**properties, "bootstrap.servers": bootstrap}
        producer = Producer({**secured, "acks": "all", "enable.idempotence": True})
        for index in range(5):
            producer.produce("secured", value=b"%d" % index)
        assert producer.flush(30) == 0
        del producer
        consumer = Consumer({**secured, "group.id": "secured-readers", "auto.offset.reset": "earliest"})
        consumer.subscribe(["secured"])
        read: list[bytes] = []
        wait_until(
            lambda: (
                read.extend(m.value() for m in consumer.consume(5, 0.5) if not m.error()) or len(read) >= 5
            )
        )
        consumer.close()
        assert sorted(read) == [b"%d" % index for index in range(5)]
        # Controls: the operator's tool with the properties file works; without it, plaintext,
        # and with a wrong password, the brokers let nobody in.
        listed = onceflow(
            "topics", "list", "--bootstrap", bootstrap, "--command-config", str(properties_path)
        )
        assert listed.returncode == 0 and "secured" in listed.stdout, listed.stderr
        plaintext = onceflow("topics", "list", "--bootstrap", bootstrap, "--timeout", "3")
        assert plaintext.returncode == 1
        wrong = tmp_path / "wrong.properties"
        wrong.write_text(properties_path.read_text().replace(properties["sasl.password"], "wrong"))
        refused = onceflow(
            "topics", "list", "--bootstrap", bootstrap, "--command-config", str(wrong), "--timeout", "3"
        )
        assert refused.returncode == 1 and "secured" not in refused.stdout
    finally:
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=60) == 0
