"""The processes a benchmark run starts: brokers (onceflow and the mock cluster) and load clients.

Every broker and client is its own OS process, so on a 2-core machine the client's Python work
does not share an interpreter (or a GIL) with the broker it measures.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic, PartitionMetadata
from prometheus_client.parser import text_string_to_metric_families

from onceflow.cluster.launcher import BrokerOptions, LaunchError, broker_command, wait_registered
from onceflow.cluster.zookeeper_server import ZooKeeperServer, free_port

BENCHMARKS_DIR = Path(__file__).resolve().parent
CLIENT_SCRIPT = BENCHMARKS_DIR / "client.py"
MOCK_BROKER_SCRIPT = BENCHMARKS_DIR / "mock_broker.py"
SPARK_JOB_SCRIPT = BENCHMARKS_DIR / "spark_job.py"
QUIX_SCRIPT = BENCHMARKS_DIR / "quix_payments.py"

_LISTENING = re.compile(r"listening on (?:\w+://)?(\S+):(\d+)")  # the first listener
_METRICS = re.compile(r"metrics on (\S+)")


class BenchmarkError(RuntimeError):
    """A broker or client did not do what the benchmark needs; the run stops."""


class BrokerProcess:
    """A broker child process that announces `... listening on HOST:PORT` on stdout."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.bootstrap = ""
        self.metrics_url = ""  # a onceflow broker started with --metrics announces it
        self._process: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None, f"{self.name} is not running"
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 120.0) -> float:
        """Start the process; return the seconds from spawn to its listening line."""
        with self.log_path.open("a") as log:
            started = time.perf_counter()
            # A session of its own: Ctrl-C reaches only the harness, which then stops the broker.
            self._process = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
                env=self.env,
            )
        assert self._process.stdout is not None
        deadline = started + timeout_s
        while True:
            remaining = deadline - time.perf_counter()
            ready, _, _ = select.select([self._process.stdout], [], [], max(remaining, 0))
            if not ready:
                self.kill()
                raise BenchmarkError(
                    f"{self.name} did not start within {timeout_s:.0f} s: {_tail(self.log_path)}"
                )
            line = self._process.stdout.readline()
            elapsed = time.perf_counter() - started
            if not line:
                self.kill()
                raise BenchmarkError(f"{self.name} exited before listening: {_tail(self.log_path)}")
            match = _LISTENING.search(line)
            if match:
                self.bootstrap = f"{match.group(1)}:{match.group(2)}"
                if "--metrics" in self.argv:
                    announced = _METRICS.search(self._process.stdout.readline())
                    if announced is None:
                        raise BenchmarkError(f"{self.name} did not announce its metrics address")
                    self.metrics_url = announced.group(1)
                return elapsed

    def stop(self, timeout_s: float = 60.0) -> float:
        """SIGTERM (a clean shutdown); return the seconds it took to exit."""
        return self._end(signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the broker's data directory is concerned."""
        self._end(signal.SIGKILL, 30.0)

    def _end(self, signum: signal.Signals, timeout_s: float) -> float:
        if self._process is None:
            return 0.0
        process, self._process = self._process, None
        started = time.perf_counter()
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise BenchmarkError(f"{self.name} ignored {signum.name} for {timeout_s:.0f} s") from None
        assert process.stdout is not None
        process.stdout.close()
        if signum == signal.SIGTERM and process.returncode != 0:
            raise BenchmarkError(f"{self.name} exited with {process.returncode}: {_tail(self.log_path)}")
        return time.perf_counter() - started

    def cpu_seconds(self) -> float:
        """User plus system CPU time the process has used so far."""
        return sum(self.cpu_times())

    def cpu_times(self) -> tuple[float, float]:
        """User and system CPU time the process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / ticks, int(fields[12]) / ticks

    def memory(self) -> dict[str, int]:
        """Resident set size now (VmRSS) and at its peak so far (VmHWM), in bytes."""
        figures = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                figures[key] = int(value.split()[0]) * 1024
        return figures

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.kill()


def onceflow_broker(
    data_dir: Path,
    settings: Mapping[str, str],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    metrics: bool = False,
) -> BrokerProcess:
    argv = [sys.executable, "-m", "onceflow.cli", "broker", "--listen", "127.0.0.1:0"]
    if metrics:
        argv += ["--metrics", "127.0.0.1:0"]
    argv += ["--data-dir", str(data_dir)]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return BrokerProcess("onceflow broker", argv, log_dir / "onceflow-broker.log", env)


class OnceflowCluster:
    """ZooKeeper and `size` onceflow brokers as `onceflow cluster run` starts them: each broker
    with the launcher's own command (its ZooKeeper session timeout and default replication
    factor) plus `settings`, each a BrokerProcess of its own, so one can be killed and restarted.
    """

    def __init__(self, size: int, data_dir: Path, settings: Mapping[str, str], log_dir: Path) -> None:
        self.size = size
        self.data_dir = data_dir
        self.settings = settings
        self.log_dir = log_dir
        self.zookeeper = ZooKeeperServer(tick_ms=200, directory=data_dir / "zookeeper")
        self.brokers: dict[int, BrokerProcess] = {}

    @property
    def name(self) -> str:
        return f"onceflow cluster of {self.size}"

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self.brokers.values() if broker.running)

    def start(self) -> None:
        try:
            self.zookeeper.start()
        except RuntimeError as error:
            raise BenchmarkError(str(error)) from None
        for broker_id in range(1, self.size + 1):
            settings = [f"{key}={value}" for key, value in self.settings.items()]
            argv = broker_command(
                broker_id,
                free_port(),
                self.data_dir / f"broker-{broker_id}",
                self.zookeeper.connect_string,
                self.size,
                BrokerOptions(settings=settings),
            )
            self.brokers[broker_id] = BrokerProcess(
                f"onceflow broker {broker_id}",
                argv,
                self.log_dir / f"onceflow-cluster-broker-{broker_id}.log",
            )
        with ThreadPoolExecutor(self.size) as pool:
            list(pool.map(BrokerProcess.start, self.brokers.values()))
        try:
            wait_registered(self.zookeeper.connect_string, self.size)
        except LaunchError as error:
            raise BenchmarkError(str(error)) from None

    def create_topic(self, topic: str, partitions: int, replication_factor: int | None = None) -> None:
        """Create the topic, by default with a replica on every broker, and wait until each
        partition's ISR is full: a client that finds an auto-created topic in the metadata may
        still reach a leader that has not taken up its leadership (NOT_LEADER_FOR_PARTITION)."""
        replicas = replication_factor or self.size
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(topic, partitions, replicas)]).values():
            future.result(timeout=30)
        for partition in range(partitions):
            if replicas == self.size:
                self.wait_in_sync(topic, partition)
            else:
                self._wait_until(topic, partition, _all_in_sync)

    def partition(self, topic: str, partition: int) -> PartitionMetadata:
        """The partition's leader, replicas and ISR, as a live broker describes them."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if partition not in partitions:
            raise BenchmarkError(f"the cluster does not know {topic}/{partition}")
        described: PartitionMetadata = partitions[partition]
        return described

    def wait_in_sync(self, topic: str, partition: int, timeout_s: float = 60.0) -> PartitionMetadata:
        """Wait until every broker is a live replica of the partition, in its ISR, and a live one leads."""
        every_broker = set(range(1, self.size + 1))
        return self._wait_until(
            topic,
            partition,
            lambda described, live: (
                live == every_broker == set(described.replicas) and _all_in_sync(described, live)
            ),
            timeout_s,
        )

    def _wait_until(
        self,
        topic: str,
        partition: int,
        ready: Callable[[PartitionMetadata, set[int]], bool],
        timeout_s: float = 60.0,
    ) -> PartitionMetadata:
        """Wait until `ready(the partition's metadata, the live broker ids)`."""
        deadline = time.monotonic() + timeout_s
        live = {broker_id for broker_id, broker in self.brokers.items() if broker.running}
        while True:
            described = self.partition(topic, partition)
            if ready(described, live):
                return described
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    f"{topic}/{partition} not in sync within {timeout_s:.0f} s: leader {described.leader},"
                    f" replicas {described.replicas}, ISR {described.isrs}, live brokers {sorted(live)}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGKILL every broker (data dirs are thrown away), then ZooKeeper, even if a kill fails."""
        try:
            for broker in self.brokers.values():
                broker.kill()
        finally:
            self.zookeeper.stop()

    def __enter__(self) -> OnceflowCluster:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def delete_topic(bootstrap: str, topic: str, data_dir: Path, timeout_s: float = 60.0) -> None:
    """Delete the topic and wait until no broker under `data_dir` has a file of it left: its
    page cache is then free for the next writes."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + timeout_s
    while any(data_dir.rglob(f"{topic}-*")):
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{topic} still has partition directories under {data_dir}")
        time.sleep(0.1)


def _all_in_sync(described: PartitionMetadata, live: set[int]) -> bool:
    """A live broker leads the partition and every replica is live and in its ISR."""
    return described.leader in live and set(described.isrs) == set(described.replicas) <= live


def stage_times(metrics_url: str) -> dict[str, dict[str, float]]:
    """Per stage of onceflow's `onceflow_stage_seconds` histogram: count, mean and p50/p99 in ms
    (a percentile is its bucket's upper bound, so as fine as the buckets)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    buckets: dict[str, list[tuple[float, float]]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "onceflow_stage_seconds":
            continue
        for sample in family.samples:
            stage = sample.labels["stage"]
            if sample.name.endswith("_bucket"):
                buckets.setdefault(stage, []).append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                sums[stage] = sample.value
            elif sample.name.endswith("_count"):
                counts[stage] = sample.value
    times = {}
    for stage, count in counts.items():
        if not count:
            continue
        ordered = sorted(buckets[stage])
        times[stage] = {
            "count": count,
            "mean_ms": sums[stage] / count * 1000,
            "p50_ms": _bucket_percentile(ordered, count, 0.50) * 1000,
            "p99_ms": _bucket_percentile(ordered, count, 0.99) * 1000,
        }
    return times


def _bucket_percentile(buckets: list[tuple[float, float]], count: float, fraction: float) -> float:
    return next(bound for bound, cumulative in buckets if cumulative >= fraction * count)


def mock_broker(log_dir: Path) -> BrokerProcess:
    return BrokerProcess(
        "mock cluster", [sys.executable, str(MOCK_BROKER_SCRIPT)], log_dir / "mock-broker.log"
    )


def run_client(command: str, options: Mapping[str, Any], timeout_s: float, log_dir: Path) -> dict[str, Any]:
    """Run one `client.py` command in its own process and return the JSON figures it prints."""
    return run_script([CLIENT_SCRIPT, command], options, timeout_s, log_dir)


def run_script(
    script_and_args: list[Any],
    options: Mapping[str, Any],
    timeout_s: float,
    log_dir: Path,
    python: Path | str = sys.executable,
) -> dict[str, Any]:
    """Run a benchmark script with `--option value` arguments; return the JSON line it prints last."""
    argv = [str(python), *map(str, script_and_args)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    log_path = log_dir / f"{Path(argv[1]).stem}.log"
    with log_path.open("w") as log:
        try:
            # subprocess.run kills the client on a timeout and on any exception, Ctrl-C included.
            finished = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BenchmarkError(
                f"{' '.join(argv[1:])} took over {timeout_s:.0f} s:\n{_tail(log_path)}"
            ) from None
    if finished.returncode != 0:
        raise BenchmarkError(f"{' '.join(argv[1:])} failed ({finished.returncode}):\n{_tail(log_path)}")
    figures: dict[str, Any] = json.loads(finished.stdout.strip().splitlines()[-1])
    return figures


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return ""


class ScriptSession:
    """A benchmark script that stays up between runs (`spark_job.py`): it prints one JSON line
    when ready, then answers each JSON command on its stdin with one JSON line."""

    def __init__(
        self,
        script: Path,
        options: Mapping[str, Any],
        log_dir: Path,
        python: Path | str = sys.executable,
    ) -> None:
        self.argv = [str(python), str(script)]
        for key, value in options.items():
            self.argv += [f"--{key.replace('_', '-')}", str(value)]
        self.log_path = log_dir / f"{script.stem}.log"
        self._process: subprocess.Popen[str] | None = None

    def start(self, timeout_s: float) -> dict[str, Any]:
        with self.log_path.open("a") as log:
            self._process = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
            )
        return self._answer("start", timeout_s)

    def ask(self, command: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(command) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # it exited: the answer's absence says so, with its log
        return self._answer(command["command"], timeout_s)

    def _answer(self, what: str, timeout_s: float) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        line = self._process.stdout.readline() if ready else ""
        if not line:
            self.kill()
            late = "no answer" if ready else f"no answer in {timeout_s:.0f} s"
            raise BenchmarkError(f"{Path(self.argv[1]).name} {what}: {late}:\n{_tail(self.log_path)}")
        figures: dict[str, Any] = json.loads(line)
        return figures

    def stop(self, timeout_s: float = 120.0) -> None:
        if self._process is None:
            return
        process, self._process = self._process, None
        assert process.stdin is not None
        try:
            process.stdin.write(json.dumps({"command": "stop"}) + "\n")
            process.stdin.close()
            process.wait(timeout_s)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        finally:
            assert process.stdout is not None
            process.stdout.close()
        if process.returncode != 0:
            raise BenchmarkError(
                f"{Path(self.argv[1]).name} exited with {process.returncode}:\n{_tail(self.log_path)}"
            )

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def __enter__(self) -> ScriptSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is None:
            self.stop()
        else:
            self.kill()
