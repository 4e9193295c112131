"""A throwaway PostgreSQL server for tests: its own data directory, 127.0.0.1 only, trust auth.

    with PostgresServer() as server:
        url = server.create_database("results")  # postgresql://postgres@127.0.0.1:<port>/results

initdb refuses to run as root, so as root the server runs as the `postgres` system user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql


def postgres_bin(tool: str) -> str:
    """`tool` from PATH, else from the newest Debian /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(tool)
    if found:
        return found
    candidates = glob.glob(f"/usr/lib/postgresql/*/bin/{tool}")
    if not candidates:
        raise RuntimeError(f"PostgreSQL's {tool} is not installed: run `make setup`")
    return max(candidates, key=lambda path: int(Path(path).parts[4]))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PostgresServer:
    def __init__(self, start_timeout_s: int = 60, stop_timeout_s: int = 30) -> None:
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port = 0
        self.directory: Path | None = None
        # Root runs the server tools as `postgres`; anyone else runs them as themselves.
        self._as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        self.directory = Path(tempfile.mkdtemp(prefix="onceflow-pg-"))
        if self._as_user:
            account = pwd.getpwnam("postgres")
            os.chown(self.directory, account.pw_uid, account.pw_gid)
        try:
            self._init_and_start(self.directory)
        except BaseException:
            self.stop()
            raise
        return self

    def _init_and_start(self, directory: Path) -> None:
        data = directory / "data"
        self._run(
            [
                postgres_bin("initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--encoding=UTF8",
                "--locale=C",
            ],
            self.start_timeout_s,
        )
        self.port = free_port()
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-c port={self.port}",
            f"-c unix_socket_directories={directory}",
            # Tests kill processes, never the machine, so skipping fsync loses nothing.
            "-c fsync=off",
            # A backend notices a SIGKILLed client within 100 ms even while it waits, and rolls back.
            "-c client_connection_check_interval=100",
        ]
        log = directory / "server.log"
        try:
            self._run(
                [
                    postgres_bin("pg_ctl"),
                    "start",
                    "-D",
                    str(data),
                    "-l",
                    str(log),
                    "-w",
                    "-t",
                    str(self.start_timeout_s),
                    "-o",
                    " ".join(options),
                ],
                self.start_timeout_s + 10,
            )
        except RuntimeError as error:
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise RuntimeError(f"{error}\nserver log:\n{tail}") from error

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def stop(self) -> None:
        if self.directory is None:
            return
        data = str(self.directory / "data")
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            pg_ctl = [postgres_bin("pg_ctl"), "stop", "-D", data, "-w", "-t", str(self.stop_timeout_s)]
            try:
                self._run([*pg_ctl, "-m", "fast"], self.stop_timeout_s + 10)
            except RuntimeError:
                self._run([*pg_ctl, "-m", "immediate"], self.stop_timeout_s + 10)
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None

    def _run(self, command: list[str], timeout_s: int) -> None:
        try:
            done = subprocess.run(
                self._as_user + command,
                cwd=self.directory,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"{command[0]} {command[1]} took over {timeout_s}s") from error
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
