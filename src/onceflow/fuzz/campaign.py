"""A fuzzing campaign against a real broker process, built the way an attacker would.

1. Real clients' requests are recorded through the fault proxy (`corpus`), after sentinel data is
   written with acks=all.
2. Many connections send seeded mutations of them (`mutate`) for a given time, one request at a
   time each, and count answers and connections the broker closed.
3. A monitor watches for a dead or unresponsive broker (a crash), for tracebacks in its log
   (internal errors), for answers to its probe that take over a second twice in a row, beyond
   what the broker's event loop and the prober waited for a CPU (a held event loop), and for the
   broker's memory growing past 256 MiB. Crashes and internal errors are narrowed down to the
   single frame that causes them, by replaying the connection's last frames one by one, and
   saved as regression cases.
4. The sentinel data must read back byte for byte, before and after a SIGKILL and restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import re
import time
import uuid
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.faults.broker_process import BrokerProcess
from onceflow.faults.proxy import FaultPlan, FaultProxy
from onceflow.fuzz import corpus, cpu_wait
from onceflow.fuzz.duration import runs_on
from onceflow.fuzz.frames import INT32, read_frame, responds
from onceflow.fuzz.mutate import MUTATIONS, Seed, make_seed

_INTERNAL_ERROR = re.compile(r"closing connection from \('127\.0\.0\.1', (\d+)\) after an internal error")
SENTINEL_RECORDS = 300
RESPONSE_TIMEOUT_S = 1.0
PROBE_TIMEOUT_S = 15.0
RETRY_PROBE_S = 0.2
MONITOR_INTERVAL_S = 0.5
PROGRESS_INTERVAL_S = 30.0
JANITOR_INTERVAL_S = 10.0
FRAMES_KEPT_PER_CONNECTION = 3
CONNECTIONS_REMEMBERED = 4096
MAX_TRIAGES = 20
# What counts as a stall (another client's ApiVersions waited this long, twice in a row, beyond
# the time the broker's loop and the prober's waited for a CPU) and as memory a request must not
# cost the broker.
BLOCKED_S = 1.0
MEMORY_GROWTH_BYTES = 256 << 20
BROKER_SETTINGS = {"group.initial.rebalance.delay.ms": "0"}


@dataclass
class Finding:
    kind: str  # crash | internal-error | blocked | memory
    api_key: int
    frame_hex: str
    saved_as: str
    detail: str


@dataclass
class FuzzReport:
    seed: int
    seconds: float = 0.0
    connections: int = 0
    corpus_frames: int = 0
    corpus_api_keys: list[int] = field(default_factory=list)
    requests_sent: int = 0
    responses: int = 0
    connections_closed_by_broker: int = 0
    connections_timed_out: int = 0
    requests_by_api_key: dict[int, int] = field(default_factory=dict)
    requests_by_mutation: dict[str, int] = field(default_factory=dict)
    crashes: int = 0
    internal_errors: int = 0
    findings: list[Finding] = field(default_factory=list)
    sentinel_records: int = 0
    sentinel_intact: bool = False
    sentinel_intact_after_restart: bool = False
    slowest_probe_s: float = 0.0  # what another client waited, at worst
    slowest_probe_held_s: float = 0.0  # of it, the longest time no wait for a CPU explains
    rss_growth_mb: int = 0

    @property
    def clean(self) -> bool:
        return (
            self.crashes == 0
            and self.internal_errors == 0
            and not any(finding.kind in ("blocked", "memory") for finding in self.findings)
            and self.sentinel_intact
            and self.sentinel_intact_after_restart
        )


def run(
    seconds: float,
    seed: int,
    connections: int,
    workdir: Path,
    regressions: Path | None,
    recorded: list[bytes] | None = None,
    replay_first: bool = False,
    min_sent: int = 0,
) -> FuzzReport:
    """Fuzz a new broker for `seconds`, and on until it sent `min_sent` requests (`runs_on`);
    `recorded` frames, or those real clients send now.
    With `replay_first`, every seed goes out once as recorded before any mutation: every API
    the clients use is served at least once, however few requests a loaded machine gets through.

    The frames already saved in `regressions` join the seeds, so known crashers are replayed.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    report = FuzzReport(seed=seed, connections=connections)
    frames = corpus.Corpus()
    recording = recorded is None

    def record(frame: bytes) -> None:
        if recording:
            frames.add(frame)

    with FaultProxy(FaultPlan(), on_request=record) as proxy:
        settings = {**BROKER_SETTINGS, "advertised.listeners": f"PLAINTEXT://{proxy.address}"}
        broker = BrokerProcess(workdir / "data", settings, workdir / "broker.log").start()
        proxy.upstream = ("127.0.0.1", broker.port)
        try:
            sentinel = _write_sentinel(proxy.address)
            if recorded is None:
                corpus.record(proxy.address)
                recording = False
            else:
                frames.frames.extend(recorded)
            report.sentinel_records = sum(len(values) for values in sentinel.values.values())
            report.corpus_frames = len(frames.frames)
            report.corpus_api_keys = sorted(frames.api_keys())
            seeds = [make_seed(frame) for frame in frames.frames + load_regressions(regressions)]
            fuzzer = _Fuzzer(broker, seeds, seed, report, regressions, replay_first)
            asyncio.run(fuzzer.run(seconds, min_sent, connections, proxy.address, sentinel.topic))
            report.sentinel_intact = sentinel.reads_back(proxy.address)
            broker.kill()
            broker.start()
            report.sentinel_intact_after_restart = sentinel.reads_back(proxy.address)
        finally:
            broker.kill()
    return report


def record_corpus(workdir: Path) -> list[bytes]:
    """The frames real clients send, recorded once, for several campaigns."""
    frames = corpus.Corpus()
    with FaultProxy(FaultPlan(), on_request=frames.add) as proxy:
        settings = {**BROKER_SETTINGS, "advertised.listeners": f"PLAINTEXT://{proxy.address}"}
        broker = BrokerProcess(workdir / "data", settings, workdir / "broker.log").start()
        proxy.upstream = ("127.0.0.1", broker.port)
        try:
            corpus.record(proxy.address)
        finally:
            broker.kill()
    return frames.frames


def load_regressions(directory: Path | None) -> list[bytes]:
    """The frames saved by earlier campaigns, one hex line per `.hex` file."""
    if directory is None or not directory.is_dir():
        return []
    return [bytes.fromhex(path.read_text().strip()) for path in sorted(directory.glob("*.hex"))]


@dataclass
class _Sentinel:
    topic: str
    values: dict[int, list[bytes]]

    def reads_back(self, bootstrap: str) -> bool:
        """Every record written before the fuzzing, at its offset, byte for byte."""
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"{self.topic}-check", "enable.auto.commit": False}
        )
        try:
            for partition, expected in self.values.items():
                consumer.assign([TopicPartition(self.topic, partition, 0)])
                got: list[bytes] = []
                deadline = time.monotonic() + 30
                while len(got) < len(expected) and time.monotonic() < deadline:
                    message = consumer.poll(0.5)
                    if message is None or message.error() is not None:
                        continue
                    if message.offset() != len(got):
                        return False
                    got.append(message.value() or b"")
                if got != expected:
                    return False
            return True
        finally:
            consumer.close()


def _write_sentinel(bootstrap: str) -> _Sentinel:
    topic = f"onceflow-fuzz-sentinel-{uuid.uuid4().hex}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    values: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for number in range(SENTINEL_RECORDS):
        value = hashlib.sha256(f"{topic}-{number}".encode()).digest() * (1 + number % 5)
        producer.produce(topic, value=value, partition=number % 3)
        values[number % 3].append(value)
    if producer.flush(30) != 0:
        raise RuntimeError("the sentinel data was not acknowledged")
    return _Sentinel(topic, values)


class _Fuzzer:
    def __init__(
        self,
        broker: BrokerProcess,
        seeds: list[Seed],
        seed: int,
        report: FuzzReport,
        regressions: Path | None,
        replay_first: bool,
    ) -> None:
        self.broker = broker
        self.seeds = seeds
        self.unplayed = deque(seeds if replay_first else ())  # sent as recorded, first
        self.seed = seed
        self.report = report
        self.regressions = regressions
        self.by_api: Counter[int] = Counter()
        self.by_mutation: Counter[str] = Counter()
        # The last frames each connection sent, by its local port: the suspects of a finding.
        self.recent: OrderedDict[int, deque[bytes]] = OrderedDict()
        self.running = asyncio.Event()
        self.stopping = False
        self.log_offset = 0
        self.signatures: set[str] = set()
        self.slow_probes = 0
        self.baseline_rss: int | None = None

    async def run(
        self, seconds: float, min_sent: int, connections: int, bootstrap: str, sentinel_topic: str
    ) -> None:
        self.log_offset = self.broker.log_path.stat().st_size
        self.running.set()
        started = time.monotonic()
        workers = [asyncio.create_task(self._worker(index)) for index in range(connections)]
        janitor = asyncio.create_task(self._janitor(bootstrap, sentinel_topic))
        next_progress = started + PROGRESS_INTERVAL_S
        try:
            while runs_on(time.monotonic() - started, seconds, self.report.requests_sent, min_sent):
                await asyncio.sleep(MONITOR_INTERVAL_S)
                await self._check_broker()
                if time.monotonic() >= next_progress:
                    next_progress += PROGRESS_INTERVAL_S
                    self._print_progress(time.monotonic() - started)
        finally:
            self.stopping = True
            self.running.set()
            await asyncio.gather(*workers, return_exceptions=True)
            janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await janitor
        await self._check_broker()
        self.report.seconds = round(time.monotonic() - started, 1)
        self.report.requests_by_api_key = dict(sorted(self.by_api.items()))
        self.report.requests_by_mutation = dict(sorted(self.by_mutation.items()))

    def _print_progress(self, elapsed_s: float) -> None:
        report = self.report
        rate = report.requests_sent / elapsed_s
        print(
            f"fuzz {elapsed_s:5.0f} s: {report.requests_sent:,} sent ({rate:,.0f}/s), "
            f"{report.connections_closed_by_broker:,} closed, {report.crashes} crashes, "
            f"{report.internal_errors} internal errors",
            flush=True,
        )

    async def _worker(self, index: int) -> None:
        rng = random.Random(f"{self.seed}:{index}")
        while not self.stopping:
            await self.running.wait()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.broker.port), PROBE_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                await self._wait_for_broker()
                continue
            port = writer.get_extra_info("sockname")[1]
            recent: deque[bytes] = deque(maxlen=FRAMES_KEPT_PER_CONNECTION)
            try:
                await self._exchange(rng, reader, writer, port, recent)
            finally:
                writer.transport.abort()

    async def _exchange(
        self,
        rng: random.Random,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        port: int,
        recent: deque[bytes],
    ) -> None:
        report = self.report
        while not self.stopping and self.running.is_set():
            if self.unplayed:
                seed = self.unplayed.popleft()
                frames, mutation_name = [seed.frame], "none"
            else:
                seed = rng.choice(self.seeds)
                mutation = rng.choice(MUTATIONS)
                frames, mutation_name = mutation(rng, seed, self.seeds), mutation.__name__
            for frame in frames:
                recent.append(frame)
                writer.write(INT32.pack(len(frame)) + frame)
            # Last used, last in line: a crash's suspects are the frames sent just before it,
            # and a connection opened long ago may have sent one a moment ago.
            self._remember(port, recent)
            report.requests_sent += len(frames)
            self.by_api[seed.api_key] += len(frames)
            self.by_mutation[mutation_name] += len(frames)
            try:
                await writer.drain()
                for _ in frames:
                    await asyncio.wait_for(read_frame(reader), RESPONSE_TIMEOUT_S)
                    report.responses += 1
            except (asyncio.IncompleteReadError, ConnectionError):
                report.connections_closed_by_broker += 1
                return
            except TimeoutError:
                # acks=0, a long poll, a rebalance that waits: move on with a new connection.
                report.connections_timed_out += 1
                return

    def _remember(self, port: int, recent: deque[bytes]) -> None:
        self.recent[port] = recent
        self.recent.move_to_end(port)
        while len(self.recent) > CONNECTIONS_REMEMBERED:
            self.recent.popitem(last=False)

    async def _wait_for_broker(self) -> None:
        while not self.stopping and not await responds(self.broker.port, 1.0):
            await self.running.wait()
            await asyncio.sleep(0.1)  # back off while the broker restarts

    async def _check_broker(self) -> None:
        """A dead or hanging broker is a crash; a traceback in its log is an internal error; an
        event loop held past BLOCKED_S, or memory grown past MEMORY_GROWTH_BYTES, is found too."""
        alive = self.broker.process is not None and self.broker.process.poll() is None
        waited_before = self._waited_for_cpu_s()
        started = time.perf_counter()
        answers = alive and await responds(self.broker.port, PROBE_TIMEOUT_S)
        took = time.perf_counter() - started
        waited_after = self._waited_for_cpu_s()
        # A probe refused or cut at once (the fuzzing connections came first) is asked again
        # until PROBE_TIMEOUT_S has passed: only a broker silent that long has stopped answering.
        while alive and not answers and time.perf_counter() - started < PROBE_TIMEOUT_S:
            await asyncio.sleep(RETRY_PROBE_S)
            answers = await responds(self.broker.port, PROBE_TIMEOUT_S)
        if not answers:
            await self._crashed("exited" if not alive else "stopped answering")
        else:
            held = took
            if waited_before is not None and waited_after is not None:
                held -= waited_after - waited_before
            self._timed(took, held)
            self._weighed()
        await self._read_log()

    def _waited_for_cpu_s(self) -> float | None:
        """How long the broker's main thread (its event loop) and this one have waited for a CPU,
        with the time the hypervisor kept the machine from running."""
        assert self.broker.process is not None
        broker = cpu_wait.waited_s(Path(f"/proc/{self.broker.process.pid}/schedstat"))
        prober = cpu_wait.waited_s(cpu_wait.SELF)
        return None if broker is None or prober is None else broker + prober + cpu_wait.stolen_s()

    def _timed(self, took: float, held: float) -> None:
        """A probe that waited past BLOCKED_S twice in a row, `held` of its `took` seconds not
        spent waiting for a CPU: the broker held its event loop."""
        report = self.report
        report.slowest_probe_s = round(max(report.slowest_probe_s, took), 3)
        report.slowest_probe_held_s = round(max(report.slowest_probe_held_s, held), 3)
        self.slow_probes = self.slow_probes + 1 if held > BLOCKED_S else 0
        if self.slow_probes == 2 and not any(finding.kind == "blocked" for finding in report.findings):
            suspects = [frame for recent in list(self.recent.values())[-8:] for frame in recent]
            detail = f"a probe waited {took:.1f} s, {held:.1f} s of it not for a CPU"
            self._found("blocked", suspects[-1] if suspects else None, detail)

    def _weighed(self) -> None:
        """The broker's resident memory: past its first reading by MEMORY_GROWTH_BYTES, a finding."""
        assert self.broker.process is not None
        rss = _resident_bytes(self.broker.process.pid)
        if rss is None:
            return
        if self.baseline_rss is None:
            self.baseline_rss = rss
        report = self.report
        report.rss_growth_mb = max(report.rss_growth_mb, (rss - self.baseline_rss) >> 20)
        grown = rss - self.baseline_rss > MEMORY_GROWTH_BYTES
        if grown and not any(finding.kind == "memory" for finding in report.findings):
            self._found("memory", None, f"the broker grew by {(rss - self.baseline_rss) >> 20} MiB")

    async def _crashed(self, how: str) -> None:
        self.report.crashes += 1
        self.running.clear()
        suspects = [frame for recent in list(self.recent.values())[-256:] for frame in recent]
        await asyncio.to_thread(self._restart)
        culprit = None
        for frame in reversed(suspects[-MAX_TRIAGES * 8 :]):
            await _send_one(self.broker.port, frame)
            if (
                self.broker.process is None
                or self.broker.process.poll() is not None
                or not await responds(self.broker.port, PROBE_TIMEOUT_S)
            ):
                culprit = frame
                await asyncio.to_thread(self._restart)
                break
        self.log_offset = self.broker.log_path.stat().st_size
        self._found("crash", culprit, f"the broker {how}")
        self.recent.clear()
        self.running.set()

    def _restart(self) -> None:
        self.broker.kill()
        self.broker.start()

    async def _read_log(self) -> None:
        with self.broker.log_path.open("rb") as log:
            log.seek(self.log_offset)
            text = log.read().decode(errors="replace")
        self.log_offset += len(text.encode(errors="replace"))
        tracebacks = text.count("Traceback (most recent call last)")
        if not tracebacks:
            return
        self.report.internal_errors += tracebacks
        for match in _INTERNAL_ERROR.finditer(text):
            signature = _last_line_after(text, match.end())
            if signature in self.signatures or len(self.signatures) >= MAX_TRIAGES:
                continue
            self.signatures.add(signature)
            suspects = list(self.recent.get(int(match.group(1)), ()))
            self._found("internal-error", await self._reproduce_internal_error(suspects), signature)

    async def _reproduce_internal_error(self, suspects: list[bytes]) -> bytes | None:
        for frame in reversed(suspects):
            before = self.broker.log_path.stat().st_size
            local_port = await _send_one(self.broker.port, frame)
            if self.broker.log_path.stat().st_size > before:
                with self.broker.log_path.open("rb") as log:
                    log.seek(before)
                    logged = log.read().decode(errors="replace")
                # Other workers keep fuzzing: only an error on this frame's own connection counts.
                ports = {int(match.group(1)) for match in _INTERNAL_ERROR.finditer(logged)}
                if local_port in ports:
                    self.log_offset = self.broker.log_path.stat().st_size
                    return frame
        return None

    def _found(self, kind: str, frame: bytes | None, detail: str) -> None:
        saved_as = ""
        api_key = -1
        if frame is not None:
            api_key = int.from_bytes(frame[:2], "big", signed=True) if len(frame) >= 2 else -1
            if self.regressions is not None:
                self.regressions.mkdir(parents=True, exist_ok=True)
                path = self.regressions / f"{kind}-api{api_key}-{hashlib.sha256(frame).hexdigest()[:12]}.hex"
                path.write_text(frame.hex() + "\n")
                saved_as = str(path)
        self.report.findings.append(
            Finding(kind, api_key, frame.hex() if frame else "", saved_as, detail.strip())
        )

    async def _janitor(self, bootstrap: str, sentinel_topic: str) -> None:
        """Topics that mutated CreateTopics requests made pile up; delete them now and then."""
        keep = {sentinel_topic}
        while True:
            await asyncio.sleep(JANITOR_INTERVAL_S)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_delete_topics_except, bootstrap, keep)


def _delete_topics_except(bootstrap: str, keep: set[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    names = [
        name
        for name in admin.list_topics(timeout=10).topics
        if name not in keep and not name.startswith("__")
    ]
    for future in admin.delete_topics(names, operation_timeout=10).values() if names else ():
        with contextlib.suppress(Exception):
            future.result(30)


def _last_line_after(text: str, start: int) -> str:
    """The exception line that ends the traceback starting at `start`."""
    lines = text[start:].splitlines()
    for index, line in enumerate(lines[1:], start=1):
        if line and not line.startswith((" ", "Traceback")):
            return line
        if index > 200:
            break
    return "unknown"


async def _send_one(port: int, frame: bytes) -> int | None:
    """Send one frame on a fresh connection and wait for its answer or for the connection to close.
    Returns the connection's local port (the one the broker's log names), None if none opened."""
    local_port = None
    with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        local_port = int(writer.get_extra_info("sockname")[1])
        try:
            writer.write(INT32.pack(len(frame)) + frame)
            await writer.drain()
            await asyncio.wait_for(read_frame(reader), 3)
        finally:
            writer.transport.abort()
    return local_port


def _resident_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass  # restarting
    return None
