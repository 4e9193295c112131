"""`onceflow cluster run`: ZooKeeper and N `onceflow broker --zookeeper` processes on 127.0.0.1,
in the foreground, until SIGTERM or Ctrl-C.

Each broker writes to `DIR/broker-N.log`, whose first line is the command that started it, so a
broker killed by hand (a fault to watch) can be started again with the same port, data dir and
id. ZooKeeper keeps its state in `DIR/zookeeper`, removed on stop: the cluster lives as long as
the command. With `metrics` (host, base port), broker N serves Prometheus metrics on the base
port + N - 1 (each on a free port for base 0); `settings` go to every broker as `--set`. With
`security` "sasl_ssl" the brokers serve SASL_SSL only, with an authorizer (`cluster.secured`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from onceflow.cluster.errors import ClusterError
from onceflow.cluster.ports import restartable_port
from onceflow.cluster.zookeeper_server import ZooKeeperServer, free_port

if TYPE_CHECKING:
    from onceflow.cluster.secured import SecuredCluster

HOST = "127.0.0.1"
# A SIGKILLed broker's partitions get new leaders once its session ends: 3 s, well under the
# issue's 5 s failover budget, and long enough for a busy 2-core machine.
SESSION_TIMEOUT_MS = 3000
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.1
PROGRESS_S = 10.0  # a slow start says what it waits for this often
RESTART_PREFIX = "# start this broker again with: "
METRICS_LINE = "onceflow broker metrics on "


class LaunchError(Exception):
    """The cluster could not start; `exit_code` 2 for bad input, 1 otherwise."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Stopped(Exception):
    """SIGTERM or SIGINT arrived."""


@dataclass
class LaunchedBroker:
    broker_id: int
    port: int
    command: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


@dataclass(frozen=True)
class BrokerOptions:
    """What `cluster run` passes to every broker besides its own address and id."""

    metrics: tuple[str, int] | None = None  # host and base port
    settings: Sequence[str] = ()  # KEY=VALUE, after the launcher's own
    security: str | None = None  # "sasl_ssl": `cluster.secured` makes what it needs

    def metrics_address(self, broker_id: int) -> str | None:
        if self.metrics is None:
            return None
        host, base = self.metrics
        return f"{host}:{base + broker_id - 1 if base else 0}"


def broker_command(
    broker_id: int,
    port: int,
    data_dir: Path,
    zookeeper: str,
    brokers: int,
    options: BrokerOptions,
    secured: SecuredCluster | None = None,
) -> list[str]:
    metrics = options.metrics_address(broker_id)
    listen = (
        ["--config", str(secured.broker_config), "--set", secured.listeners(HOST, port)]
        if secured is not None
        else ["--listen", f"{HOST}:{port}"]
    )
    return [
        sys.executable,
        "-m",
        "onceflow.cli",
        "broker",
        *listen,
        "--data-dir",
        str(data_dir),
        "--zookeeper",
        zookeeper,
        "--broker-id",
        str(broker_id),
        "--set",
        f"zookeeper.session.timeout.ms={SESSION_TIMEOUT_MS}",
        "--set",
        f"default.replication.factor={min(3, brokers)}",
        # The internal topics too, or a cluster of fewer than 3 brokers never has coordinators.
        "--set",
        f"offsets.topic.replication.factor={min(3, brokers)}",
        "--set",
        f"transaction.state.log.replication.factor={min(3, brokers)}",
        "--set",
        f"transaction.state.log.min.isr={min(2, brokers)}",
        *(["--metrics", metrics] if metrics else []),
        *(argument for setting in options.settings for argument in ("--set", setting)),
    ]


def restart_line(command: list[str]) -> str:
    """The command as a shell line, with the PYTHONPATH this one runs with (a source checkout)."""
    python_path = os.environ.get("PYTHONPATH")
    prefix = ["env", f"PYTHONPATH={python_path}"] if python_path else []
    return shlex.join(prefix + command)


def run_cluster(
    brokers: int, data_dir: Path, out: Callable[[str], None], options: BrokerOptions = BrokerOptions()
) -> int:
    """Start, print the addresses, wait for a signal, stop everything. Raises LaunchError."""
    if brokers < 1:
        raise LaunchError(f"--brokers must be at least 1, got {brokers}", exit_code=2)
    if options.metrics is not None and options.metrics[1] and options.metrics[1] + brokers - 1 > 65535:
        raise LaunchError(f"--metrics: ports {options.metrics[1]}.. run past 65535", exit_code=2)
    data_dir = data_dir.resolve()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / ".writable").touch()
        (data_dir / ".writable").unlink()
    except OSError as error:
        raise LaunchError(f"cannot use --data-dir {data_dir}: {error.strerror or error}") from error
    zookeeper_dir = data_dir / "zookeeper"
    if zookeeper_dir.exists():
        raise LaunchError(
            f"{zookeeper_dir} exists: another `onceflow cluster run` uses this data dir, "
            "or one was killed (remove that directory)"
        )

    def stop_on_signal(signum: int, _frame: FrameType | None) -> None:
        raise Stopped(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, stop_on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    zookeeper = ZooKeeperServer(tick_ms=200, directory=zookeeper_dir)
    launched: list[LaunchedBroker] = []
    try:
        try:
            zookeeper.start()
        except RuntimeError as error:
            raise LaunchError(str(error).splitlines()[0]) from error
        assert zookeeper.process is not None
        out(f"zookeeper pid {zookeeper.process.pid} listening on {zookeeper.connect_string}")
        secured = None
        if options.security is not None:
            from onceflow.cluster.secured import secure  # cryptography, the `security` extra

            secured = secure(data_dir / "security", zookeeper.connect_string)
        for broker_id in range(1, brokers + 1):
            launched.append(
                _start_broker(broker_id, data_dir, zookeeper.connect_string, brokers, options, secured)
            )
        for broker in launched:
            _wait_listening(broker)
            out(f"broker {broker.broker_id} pid {broker.process.pid} listening on {broker.address}")
            if options.metrics is not None:
                out(f"broker {broker.broker_id} metrics on {_metrics_url(broker)}")
        wait_registered(zookeeper.connect_string, brokers, out)
        bootstrap = ",".join(broker.address for broker in launched)
        out(f"cluster ready: bootstrap {bootstrap}")
        if secured is not None:
            out(
                f"clients connect over SASL_SSL as the super user admin with {secured.client_properties}"
                f" (e.g. onceflow topics list --bootstrap {bootstrap} --command-config"
                f" {secured.client_properties})"
            )
        _watch(launched, out)
    except Stopped:
        pass
    finally:
        for signum in previous:  # a second Ctrl-C must not cut the shutdown short
            signal.signal(signum, signal.SIG_IGN)
        _stop(launched)
        zookeeper.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    out("cluster stopped")
    return 0


def _start_broker(
    broker_id: int,
    data_dir: Path,
    zookeeper: str,
    brokers: int,
    options: BrokerOptions,
    secured: SecuredCluster | None,
) -> LaunchedBroker:
    # Below the ephemeral range: the command in the broker's log starts it again on this port
    # after a kill, which a client connection's local port could otherwise have taken.
    port = restartable_port() or free_port()
    command = broker_command(
        broker_id, port, data_dir / f"broker-{broker_id}", zookeeper, brokers, options, secured
    )
    log_path = data_dir / f"broker-{broker_id}.log"
    with log_path.open("wb") as log:
        log.write(f"{RESTART_PREFIX}{restart_line(command)}\n".encode())
        log.flush()
        # Its own session: a Ctrl-C reaches this process only, which stops the brokers in order.
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return LaunchedBroker(broker_id, port, command, log_path, process)


def _log_tail(broker: LaunchedBroker) -> str:
    lines = broker.log_path.read_text(errors="replace").splitlines()[1:]
    return lines[-1] if lines else "no output"


def _wait_listening(broker: LaunchedBroker) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while "onceflow broker listening on" not in broker.log_path.read_text(errors="replace"):
        if broker.process.poll() is not None:
            raise LaunchError(f"broker {broker.broker_id} did not start: {_log_tail(broker)}")
        if time.monotonic() > deadline:
            raise LaunchError(f"broker {broker.broker_id} did not start in {START_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)


def _metrics_url(broker: LaunchedBroker) -> str:
    """The address the broker printed after its listening line (the port it got, for port 0)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        for line in broker.log_path.read_text(errors="replace").splitlines():
            if line.startswith(METRICS_LINE):
                return line.removeprefix(METRICS_LINE)
        if broker.process.poll() is not None or time.monotonic() > deadline:
            raise LaunchError(f"broker {broker.broker_id} did not serve metrics: {_log_tail(broker)}")
        time.sleep(POLL_S)


def wait_registered(zookeeper: str, brokers: int, out: Callable[[str], None] | None = None) -> None:
    """Every broker registered and a controller elected: clients see the whole cluster. With
    `out`, a line every PROGRESS_S until then, saying what is missing."""
    from onceflow.cluster.zk import read_cluster  # kazoo, as the brokers need it anyway

    deadline = time.monotonic() + START_TIMEOUT_S
    next_progress = time.monotonic() + PROGRESS_S
    while True:
        try:
            view = read_cluster(zookeeper, 5.0)
            if len(view.brokers) == brokers and view.controller_id in view.brokers:
                return
            controller = view.controller_id if view.controller_id in view.brokers else "none"
            missing = f"brokers {sorted(view.brokers)} of {brokers} registered, controller {controller}"
        except ClusterError as error:
            missing = str(error)  # the brokers have not created the znodes yet
        now = time.monotonic()
        if now > deadline:
            raise LaunchError(
                f"the brokers did not all register in ZooKeeper in {START_TIMEOUT_S:.0f} s: {missing}"
            )
        if out is not None and now > next_progress:
            out(f"waiting for the brokers to register in ZooKeeper: {missing}")
            next_progress = now + PROGRESS_S
        time.sleep(POLL_S)


def _watch(launched: list[LaunchedBroker], out: Callable[[str], None]) -> None:
    """Until a signal: say once when a broker exits, and how to start it again."""
    reported: set[int] = set()
    while True:
        for broker in launched:
            code = broker.process.poll()
            if code is not None and broker.broker_id not in reported:
                reported.add(broker.broker_id)
                out(
                    f"broker {broker.broker_id} pid {broker.process.pid} exited with code {code}; "
                    f"the first line of {broker.log_path} starts it again"
                )
        time.sleep(POLL_S * 5)


def _stop(launched: list[LaunchedBroker]) -> None:
    """SIGTERM to all at once (each closes its ZooKeeper session), then SIGKILL the slow ones."""
    for broker in launched:
        if broker.process.poll() is None:
            broker.process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for broker in launched:
        try:
            broker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            broker.process.kill()
            broker.process.wait()
