"""What an operator watches and does on a cluster: `onceflow cluster run --metrics` (broker N on
PORT + N - 1), replica health in the metrics, offline partitions in `topics describe`, and
`cluster elect-leaders`. One `cluster run` for the module; each test uses topics of its own and
leaves every broker running but the last, which stops broker 3 and starts it again by hand."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from onceflow.cluster.launcher import RESTART_PREFIX
from tests.broker.test_metrics import Samples, scrape, value
from tests.cli.commands import onceflow
from tests.cluster_mode.conftest import create_topic_at
from tests.cluster_mode.test_cluster_run import BROKER_LINE, RunningCommand, gone, start
from tests.conftest import wait_until
from tests.wire import WireClient, make_batch, produce

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(240)]

LAG_MS = 2500  # replica.lag.time.max.ms: a stopped follower leaves the ISR within 1.5 x this
HOST = "127.0.0.1"


@dataclass
class RunCluster:
    command: RunningCommand
    directory: Path
    base_port: int
    pids: dict[int, int]
    addresses: dict[int, str]
    metrics: dict[int, str]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.addresses.values())

    def samples(self, broker_id: int) -> Samples:
        return scrape(self.metrics[broker_id])

    def gauge(self, broker_id: int, name: str, **labels: str) -> float:
        return value(self.samples(broker_id), name, **labels)

    def metadata(self, broker_id: int, topic: str) -> object:
        with WireClient(self.addresses[broker_id]) as wire:
            return wire.request(
                3,
                12,
                topics=[{"name": topic, "topic_id": None}],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ).topics[0]


def _free_ports(count: int) -> int:
    """A base port with `count` free ports from it, below the ephemeral range."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for base in random.sample(range(max(1024, low - 10_000), low - count), 200):
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind((HOST, port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free ports")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunCluster]:
    directory = tmp_path_factory.mktemp("operations") / "cluster"
    base = _free_ports(3)
    command = [sys.executable, "-m", "onceflow.cli", "cluster", "run", "--brokers", "3"]
    command += ["--data-dir", str(directory), "--metrics", f"{HOST}:{base}"]
    # A follower leaves the ISR well before its ZooKeeper session (4 s) ends.
    for setting in (f"replica.lag.time.max.ms={LAG_MS}", "zookeeper.session.timeout.ms=4000"):
        command += ["--set", setting]
    running = start(command)
    try:
        running.wait_for("cluster ready")
        pids, addresses, metrics = {}, {}, {}
        for line in running.seen:
            if match := BROKER_LINE.fullmatch(line):
                broker_id = int(match.group(1))
                pids[broker_id], addresses[broker_id] = int(match.group(2)), match.group(3)
            elif line.startswith("broker ") and " metrics on " in line:
                metrics[int(line.split()[1])] = line.rsplit(" ", 1)[1]
        yield RunCluster(running, directory, base, pids, addresses, metrics)
    finally:
        running.process.terminate()
        running.process.wait(timeout=60)


def _create(run: RunCluster, topic: str, replicas: list[int]) -> None:
    # A broker stopped by a test before (SIGSTOP past its ZooKeeper session) registers again a
    # moment after it runs again: until then it is not live, and no assignment may name it.
    wait_until(lambda: set(replicas) <= _live(run, 2), timeout_s=60)
    with WireClient(run.addresses[2]) as wire:
        create_topic_at(wire, topic, [replicas])
    # Each broker learns of the topic from ZooKeeper in its own time; tests then ask any of them.
    wait_until(lambda: all(run.metadata(n, topic).partitions for n in _live(run, 2)), timeout_s=60)


def _live(run: RunCluster, broker_id: int) -> set[int]:
    """The brokers live in `broker_id`'s view, as its Metadata lists them."""
    with WireClient(run.addresses[broker_id]) as wire:
        answer = wire.request(
            3, 12, topics=[], allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
    return {broker.node_id for broker in answer.brokers}


def _waited(condition: Callable[[], bool], timeout_s: float) -> float:
    """How long `condition` took to hold (it must, within `timeout_s`)."""
    started = time.monotonic()
    wait_until(condition, timeout_s=timeout_s)
    return time.monotonic() - started


def test_each_broker_serves_metrics_on_its_port_and_replica_health_follows_a_stopped_follower(
    run: RunCluster,
) -> None:
    assert run.metrics == {n: f"http://{HOST}:{run.base_port + n - 1}/metrics" for n in (1, 2, 3)}
    assert (
        sum(run.gauge(n, "kafka_controller_kafkacontroller_active_controller_count") for n in (1, 2, 3)) == 1
    )
    topic, partition = "watched", {"topic": "watched", "partition": "0"}
    _create(run, topic, [1, 2, 3])
    isr = "kafka_cluster_partition_in_sync_replicas_count"
    hw, log_end = "onceflow_partition_high_watermark", "kafka_log_log_log_end_offset"
    under = "kafka_server_replicamanager_under_replicated_partitions"
    wait_until(lambda: run.gauge(1, isr, **partition) == 3, timeout_s=60)
    assert run.gauge(1, under) == 0  # the control: nothing is under-replicated before the fault
    with WireClient(run.addresses[1]) as wire:
        assert produce(wire, topic, 0, make_batch([b"a", b"b", b"c"])).error_code == ErrorCode.none
    wait_until(lambda: run.gauge(1, hw, **partition) == 3)
    assert run.gauge(1, "kafka_server_replicamanager_leader_count") >= 1
    assert run.gauge(2, hw, **partition) == 0  # only the leader exports the partition's own view

    # The high watermark is the ISR's: a record the leader holds and has fsynced, and the stopped
    # follower has not copied, is above it for as long as that follower is in the ISR.
    end = 3
    epoch = run.metadata(1, topic).partitions[0].leader_epoch
    for _attempt in range(3):
        flushes = run.gauge(1, "kafka_log_logflushstats_log_flush_seconds_count")
        os.kill(run.pids[3], signal.SIGSTOP)
        stopped_at = time.monotonic()
        with WireClient(run.addresses[1]) as wire:
            wire.request(
                0,
                9,
                transactional_id=None,
                acks=-1,
                timeout=200,
                topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": make_batch([b"x"])}]}],
            )
        end += 1
        wait_until(
            lambda end=end, flushes=flushes: (  # type: ignore[misc]
                run.gauge(1, log_end, **partition) == end
                and run.gauge(1, "kafka_log_logflushstats_log_flush_seconds_count") > flushes
            ),
            timeout_s=10,
        )
        samples = run.samples(1)
        if value(samples, isr, **partition) == 3:
            assert value(samples, hw, **partition) == end - 1 < value(samples, log_end, **partition)
            break
        # The follower left the ISR before the scrape (a loaded machine): let it back in and retry.
        os.kill(run.pids[3], signal.SIGCONT)
        wait_until(
            lambda end=end: run.gauge(1, isr, **partition) == 3 and run.gauge(1, hw, **partition) == end,  # type: ignore[misc]
            timeout_s=60,
        )
    else:
        pytest.fail("the stopped follower left the ISR before every check of the high watermark")

    took = _waited(lambda: run.gauge(1, under) > 0, timeout_s=30) + (time.monotonic() - stopped_at)
    # Kafka's leader looks every replica.lag.time.max.ms / 2: the worst case is 1.5 x the lag.
    assert took < 1.5 * LAG_MS / 1000 + 5, took
    assert run.gauge(1, isr, **partition) < 3
    if run.metadata(1, topic).partitions[0].leader_epoch == epoch:  # the leader shrank it, not the
        # controller (which bumps the epoch, once the stopped broker's session has ended)
        assert run.gauge(1, "kafka_server_replicamanager_isr_shrinks_total") >= 1
    os.kill(run.pids[3], signal.SIGCONT)
    wait_until(lambda: run.gauge(1, under) == 0 and run.gauge(1, isr, **partition) == 3, timeout_s=60)
    samples = run.samples(1)
    assert value(samples, hw, **partition) == value(samples, log_end, **partition) == end
    assert value(samples, "kafka_server_replicamanager_isr_expands_total") >= 1


def test_an_offline_partition_is_described_and_counted_and_preferred_leaders_come_back(
    run: RunCluster,
) -> None:
    _create(run, "alone", [3])
    _create(run, "elected", [3, 1, 2])
    wait_until(lambda: run.metadata(1, "elected").partitions[0].leader_id == 3, timeout_s=60)
    wait_until(lambda: len(run.metadata(1, "elected").partitions[0].isr_nodes) == 3, timeout_s=60)
    offline = "kafka_controller_kafkacontroller_offline_partitions_count"
    # The controller counts from its own view, which may not have applied the new leaders yet.
    wait_until(lambda: sum(run.gauge(n, offline) for n in (1, 2, 3)) == 0, timeout_s=60)

    os.kill(run.pids[3], signal.SIGTERM)  # a clean stop ends its ZooKeeper session at once
    wait_until(lambda: gone(run.pids[3]), timeout_s=60)
    restarted = None
    try:
        wait_until(lambda: run.metadata(1, "elected").partitions[0].leader_id == 1, timeout_s=60)
        wait_until(lambda: sum(run.gauge(n, offline) for n in (1, 2)) == 1, timeout_s=60)
        described = onceflow(
            "topics", "describe", "alone", "elected", "--bootstrap", run.addresses[1], "--json"
        )
        assert described.returncode == 0, described.stderr
        alone, elected = json.loads(described.stdout)
        assert alone["partitions"][0]["leader"] is None and alone["partitions"][0]["end_offset"] is None
        assert alone["partitions"][0]["offline_replicas"] == [3]
        assert elected["partitions"][0]["leader"] == 1
        table = onceflow("topics", "describe", "alone", "--bootstrap", run.addresses[1])
        assert table.returncode == 0 and "offline (no leader): alone-0" in table.stdout

        # The preferred replica is gone: no election (the control of the one below).
        refused = onceflow("cluster", "elect-leaders", "--topic", "elected", "--bootstrap", run.addresses[1])
        assert refused.returncode == 1 and "1 partition(s) not elected: elected-0" in refused.stderr

        first_line = (run.directory / "broker-3.log").read_text().splitlines()[0]
        restarted = start(shlex.split(first_line.removeprefix(RESTART_PREFIX)))
        restarted.wait_for("listening on")
        wait_until(lambda: len(run.metadata(1, "elected").partitions[0].isr_nodes) == 3, timeout_s=60)
        before = run.metadata(1, "elected").partitions[0]
        assert before.leader_id == 1  # back in the ISR, it does not lead again by itself
        elect = onceflow("cluster", "elect-leaders", "--topic", "elected", "--bootstrap", run.addresses[2])
        assert elect.returncode == 0, elect.stderr
        assert "1 partition(s) elected (preferred)" in elect.stdout
        # Broker 1 learns the election from ZooKeeper a little later than broker 2 answered.
        wait_until(lambda: run.metadata(1, "elected").partitions[0].leader_id != 1, timeout_s=60)
        after = run.metadata(1, "elected").partitions[0]
        assert (after.leader_id, after.leader_epoch) == (3, before.leader_epoch + 1)
        again = onceflow("cluster", "elect-leaders", "--all", "--bootstrap", run.addresses[1], "--json")
        assert (again.returncode, json.loads(again.stdout)) == (0, [])  # none needed one
        wait_until(lambda: sum(run.gauge(n, offline) for n in (1, 2, 3)) == 0, timeout_s=60)
    finally:
        if restarted is not None:
            restarted.process.terminate()
            restarted.process.wait(timeout=60)
