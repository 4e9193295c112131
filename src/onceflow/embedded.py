"""EmbeddedBroker: the broker on a background thread, for tests, tools and Spark jobs."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType

from onceflow.broker.config import BrokerConfig
from onceflow.broker.core import Broker
from onceflow.server import BrokerServer


class EmbeddedBroker:
    """A context manager running a broker on 127.0.0.1.

    >>> with EmbeddedBroker() as broker:
    ...     producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        port: int = 0,
        config: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        metrics_port: int | None = None,
    ) -> None:
        """`metrics_port` serves Prometheus metrics on `host` (0 picks a free port)."""
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="onceflow-"))
        self._config = BrokerConfig(dict(config or {}))
        self._host = host
        self._port = port
        self._metrics_port = metrics_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: BrokerServer | None = None
        self._stopped: asyncio.Event | None = None
        self._storage_failure: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        assert self._server is not None, "the broker is not running"
        host, port = self._server.address
        return f"{host}:{port}"

    def bootstrap(self, listener: str) -> str:
        """HOST:PORT of a listener (by name, as in `listeners`)."""
        assert self._server is not None, "the broker is not running"
        host, port = self._server.addresses[listener]
        return f"{host}:{port}"

    @property
    def port(self) -> int:
        assert self._server is not None, "the broker is not running"
        return self._server.address[1]

    @property
    def metrics_url(self) -> str:
        assert self._server is not None, "the broker is not running"
        address = self._server.metrics_address
        assert address is not None, "the broker was started without metrics_port"
        return f"http://{address[0]}:{address[1]}/metrics"

    def start(self) -> EmbeddedBroker:
        """Starts the broker (again, after a stop); raises what kept it from starting, after
        which stop() has nothing to stop."""
        if self._thread is not None:
            raise RuntimeError("this EmbeddedBroker is already running: stop() it first")
        self._storage_failure = None
        started: Future[None] = Future()
        thread = threading.Thread(target=self._run, args=(started,), name="onceflow-broker", daemon=True)
        thread.start()
        try:
            started.result(timeout=60)
        except BaseException:
            thread.join(timeout=60)
            self._forget()
            raise
        self._thread = thread
        return self

    @property
    def storage_failure(self) -> str | None:
        """Why the broker halted (a failed fsync), if it did: it then serves no more. Kept
        after stop(), until the next start()."""
        return self._storage_failure if self._server is None else self._server.broker.storage_failure

    def stop(self) -> None:
        if self._loop is None or self._stopped is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has ended: the broker halted
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout=60)
        assert self._server is not None
        self._storage_failure = self._server.broker.storage_failure
        self._forget()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _forget(self) -> None:
        self._loop = self._stopped = self._server = self._thread = None

    def _run(self, started: Future[None]) -> None:
        asyncio.run(self._main(started))

    async def _main(self, started: Future[None]) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            metrics_address = None if self._metrics_port is None else (self._host, self._metrics_port)
            broker = Broker(self.data_dir, self._config, metrics=metrics_address is not None)
            # With `listeners` in the config they say where to listen; else host and port do.
            listen = None if "listeners" in self._config.props else (self._host, self._port)
            self._server = BrokerServer(broker, listen, metrics_address)
            await self._server.start()
        except BaseException as error:
            started.set_exception(error)
            return
        started.set_result(None)
        stopped, halted = asyncio.create_task(self._stopped.wait()), asyncio.create_task(broker.halted.wait())
        # A halted broker (a failed fsync) stops serving at once; its stop skips the flush.
        await asyncio.wait([stopped, halted], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        halted.cancel()
        await self._server.stop()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
