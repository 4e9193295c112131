"""A throwaway ZooKeeper server, for `onceflow cluster run` and the tests: standalone, 127.0.0.1
only, a free port, a data dir of its own that `stop` removes (and so never fsyncs).

    with ZooKeeperServer() as server:
        server.connect_string  # 127.0.0.1:<port>

It runs the Debian package's jars (`/usr/share/java/zookeeper.jar`, whose manifest names the
rest of its class path) with java, and answers `ruok` before `start` returns.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
# A ZooKeeper for a few brokers does little work: the client compiler alone and the serial
# collector cost it 0.56-0.68 of the CPU of the JVM's defaults (a 3-broker cluster's start, four
# topics, a produce and a broker's death: 0.92-1.14 s against 1.64-1.68 s, alternating).
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def answers_ruok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
            connection.sendall(b"ruok")
            return connection.recv(4) == b"imok"
    except OSError:
        return False


class ZooKeeperNotInstalledError(RuntimeError):
    pass


class ZooKeeperServer:
    def __init__(
        self, start_timeout_s: float = 30, tick_ms: int = 200, directory: Path | None = None
    ) -> None:
        """`directory`: where its config, data and log go (a new temporary one if None); it must
        not exist yet, since `stop` removes it."""
        self.start_timeout_s = start_timeout_s
        self.requested_directory = directory
        # Sessions may be as short as 2 ticks: brokers' sessions end soon after a SIGKILL.
        self.tick_ms = tick_ms
        self.port = 0
        self.directory: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ZooKeeperServer:
        java = shutil.which("java")
        if java is None or not ZOOKEEPER_JAR.exists():
            raise ZooKeeperNotInstalledError(
                "ZooKeeper is not installed: run `make setup` (Debian's zookeeper package)"
            )
        if self.requested_directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="onceflow-zk-"))
        else:
            self.requested_directory.mkdir(parents=True)
            self.directory = self.requested_directory
        self.port = free_port()
        config = self.directory / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_ms}",
                    f"dataDir={self.directory / 'data'}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    # The admin server would take port 8080.
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok",
                    # No fsync of its transaction log: the data dir never outlives this process
                    # (`stop` removes it; `onceflow cluster run` refuses one a kill left behind),
                    # so the fsyncs kept nothing safe, while every read and session ping waited
                    # behind them (two dd writers beside: reads' p99 0.42-0.57 s with them,
                    # 0.07-0.23 s without), and a ping answered late drops a session's
                    # connection ("outstanding heartbeat ping not received").
                    "forceSync=no",
                    "",
                ]
            )
        )
        with (self.directory / "server.log").open("wb") as log:
            self.process = subprocess.Popen(
                [java, "-Xmx256m", *JVM_OPTIONS, "-cp", str(ZOOKEEPER_JAR), MAIN_CLASS, str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                # Not in the caller's process group: a Ctrl-C there must not kill ZooKeeper
                # before the brokers have closed their sessions.
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not answers_ruok(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                output = (self.directory / "server.log").read_text(errors="replace")[-4000:]
                self.stop()
                raise RuntimeError(f"ZooKeeper did not start:\n{output}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
