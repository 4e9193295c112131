"""One lab run: a broker (the lab's own, or `--bootstrap`), producers and a consume-process-produce
stage as processes, the seeded faults of `faults.py`, a final read of both topics and the checker.

Clients always connect through the fault proxy. The lab's own broker advertises the proxy; any
other cluster is reached through the proxy's address rewriting (a port per broker), so that every
client-side fault works against any Kafka-compatible broker."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.faults.broker_process import BrokerProcess, wait_until
from onceflow.faults.proxy import COPY_ANSWER_WAIT_S, FaultPlan, FaultProxy
from onceflow.lab import broker_metrics, controls, coverage, faults, timeline
from onceflow.lab.broker_metrics import BrokerMetrics
from onceflow.lab.checker import CheckResult, check, log_agreement
from onceflow.lab.history import Event, HistoryWriter, read_history
from onceflow.lab.presets import PRESETS
from onceflow.lab.transactions import fates, outcomes

PARTITIONS = 3  # asked for; a cluster that only auto-creates topics may pick another number
PRODUCERS = 2
WORKERS = 2
PRODUCE_S = 6.0  # the producers spread their values over this long; the faults fall inside it
DRAIN_TIMEOUT_S = 60.0
STALL_S = 12.0
SIGNALED = ("kill-producer", "kill-consumer", "pause-consumer")
AT_CONSUMERS = ("kill-consumer", "pause-consumer")
SHOWN_CONTEXTS = 20  # anomalies whose surrounding operations the JSON carries
ZOMBIE_WAIT_S = 10.0  # a zombie goes on at the latest this long after its successor started
CLIENT_START_TIMEOUT_S = 60.0
# Runs at once: a run mostly waits on its timed faults, so three take about as long as one.
SIDE_BY_SIDE = 3

Log = Callable[[str], None]
_RUN_NUMBERS = itertools.count()  # runs side by side in one process start in the same nanosecond


@dataclass(frozen=True)
class Scenario:
    guarantee: str
    faults: tuple[str, ...]
    messages: int = 300
    seed: int = 0
    bootstrap: str | None = None  # None: the lab starts its own broker
    # A misbehaving broker (`proxy.BROKER_FAULTS`), to show the checker catches it; own broker only.
    broker_fault: str | None = None
    produce_s: float = PRODUCE_S


@dataclass
class RunResult:
    scenario: Scenario
    check: CheckResult
    drained: bool
    injected: list[str] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)
    # What the broker fault did, with the values of the records it dropped or copied.
    broker_fault_effects: dict[str, Any] | None = None
    # What the report draws (`timeline.build`), and the operations around each anomaly shown.
    timeline: dict[str, Any] = field(default_factory=dict)
    contexts: list[list[dict[str, Any]]] = field(default_factory=list)
    broker_metrics: BrokerMetrics | None = None  # the lab's own broker only
    # Whether the broker's own view of its aborted records matches the history's (never a verdict).
    cross_check: dict[str, Any] = field(default_factory=dict)
    control: dict[str, Any] | None = None  # with a broker fault: was it caught (`controls.py`)
    transactions: dict[str, int] = field(default_factory=dict)  # by outcome, as the clients saw it

    @property
    def not_tested(self) -> list[str]:
        """The anomalies this run had no chance to show: its 0 for them proves nothing."""
        return [anomaly for anomaly, verdict in self.verdicts.items() if verdict == coverage.NOT_TESTED]

    def to_json(self) -> dict[str, Any]:
        """The run as the reports want it; see `report.py`."""
        return {
            "guarantee": self.scenario.guarantee,
            "faults": list(self.scenario.faults),
            "broker_fault": self.scenario.broker_fault,
            "seed": self.scenario.seed,
            "produced": self.check.produced,
            "acknowledged": self.check.acknowledged,
            "delivered": self.check.delivered,
            "lost": self.check.lost,
            "duplicated": self.check.duplicated,
            "aborted_reads": self.check.aborted_reads,
            "drained": self.drained,
            "injected": self.injected,
            "coverage": self.coverage,
            "verdicts": self.verdicts,
            "broker_fault_effects": self.broker_fault_effects,
            "unit": "values",
            "cross_check": self.cross_check,
            "control": self.control,
            "transactions": self.transactions,
            "timeline": self.timeline,
            "broker_metrics": None if self.broker_metrics is None else self.broker_metrics.to_json(),
            "anomalies": [
                {**anomaly.to_json(), "history": self.contexts[index] if index < len(self.contexts) else []}
                for index, anomaly in enumerate(self.check.anomalies)
            ],
        }


def run_lab(
    guarantees: Iterable[str],
    fault_sets: Iterable[tuple[str, ...]],
    messages: int,
    seed: int,
    workdir: Path,
    bootstrap: str | None = None,
    log: Log = lambda _line: None,
    broker_fault: str | None = None,
    produce_s: float = PRODUCE_S,
) -> list[RunResult]:
    """Every guarantee under every fault set, one fresh run (and broker) each."""
    scenarios = [
        Scenario(guarantee, fault_set, messages, seed, bootstrap, broker_fault, produce_s)
        for fault_set in fault_sets
        for guarantee in guarantees
    ]
    runs = [
        (scenario, workdir / f"run-{number}-{scenario.guarantee}")
        for number, scenario in enumerate(scenarios)
    ]
    return run_scenarios(runs, log)


def run_scenarios(runs: Sequence[tuple[Scenario, Path]], log: Log = lambda _line: None) -> list[RunResult]:
    """Runs each scenario in its directory, `SIDE_BY_SIDE` at a time; the results in the order given.
    Runs share nothing (each has its proxy, its broker or its topics, and its seeded faults)."""
    for _scenario, run_dir in runs:
        run_dir.mkdir(parents=True, exist_ok=True)
    pool = ThreadPoolExecutor(max_workers=SIDE_BY_SIDE)
    try:
        return list(pool.map(lambda run: run_scenario(run[0], run[1], log), runs))
    finally:
        # After a failed run or Ctrl-C, the runs not started never start; those running end first.
        pool.shutdown(cancel_futures=True)


def run_scenario(scenario: Scenario, run_dir: Path, log: Log = lambda _line: None) -> RunResult:
    """Runs one scenario in `run_dir` (history, logs, broker data) and checks its history."""
    if scenario.bootstrap is not None and faults.OWN_BROKER_FAULTS & set(scenario.faults):
        raise ValueError(f"{', '.join(sorted(faults.OWN_BROKER_FAULTS))} needs the lab's own broker")
    if scenario.bootstrap is not None and scenario.broker_fault is not None:
        raise ValueError("a broker fault needs the lab's own broker")
    plan = FaultPlan(seed=scenario.seed, broker_fault=scenario.broker_fault)
    upstream = None if scenario.bootstrap is None else _address(scenario.bootstrap.split(",")[0])
    with FaultProxy(plan, upstream, rewrite_addresses=upstream is not None) as proxy:
        broker = None
        if scenario.bootstrap is None:
            broker = BrokerProcess(
                run_dir / "broker-data",
                {
                    # Clients learn the proxy's address from Metadata, so every request passes it.
                    "advertised.listeners": f"PLAINTEXT://{proxy.address}",
                    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
                    "group.initial.rebalance.delay.ms": "0",
                },
                run_dir / "broker.log",
                metrics=True,
            ).start()
            proxy.upstream = ("127.0.0.1", broker.port)
        try:
            return _Run(scenario, run_dir, proxy, broker, log).execute()
        finally:
            if broker is not None:
                broker.kill()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    return host.strip("[]"), int(port)


@dataclass
class _Zombie:
    """A worker told to pause at its crash point: signaled, then replaced by a successor, then resumed."""

    name: str
    process: subprocess.Popen[str]
    incarnation: str
    state: str = "signaled"
    successor: str = ""
    since: float = 0.0


class _Run:
    def __init__(
        self,
        scenario: Scenario,
        run_dir: Path,
        proxy: FaultProxy,
        broker: BrokerProcess | None,
        log: Log,
    ) -> None:
        self.scenario = scenario
        self.preset = PRESETS[scenario.guarantee]
        self.proxy = proxy
        self.broker = broker
        self.log = log
        self.history_dir = run_dir / "history"
        self.logs_dir = run_dir / "logs"
        self.history_dir.mkdir(exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        # Unique names, so that runs can share one external broker.
        self.tag = f"{os.getpid()}-{time.time_ns() % 10**9}-{next(_RUN_NUMBERS)}"
        self.input = f"lab-{self.tag}-input"
        self.output = f"lab-{self.tag}-output"
        # A preset without a consume-process-produce stage (the idempotent producer's) has no output.
        self.workers = WORKERS if self.preset.consumes else 0
        self.topics = (self.input, self.output) if self.workers else (self.input,)
        self.group = f"lab-{self.tag}"
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.incarnations: dict[str, int] = {}
        self.finished: set[str] = set()
        self.injected: list[str] = []
        self.broker_kills = 0
        self.rng = random.Random(scenario.seed)
        self.partitions: dict[str, int] = {}
        self.zombies: list[_Zombie] = []
        # The faults as they happened, for the report's timeline.
        self.fault_log = HistoryWriter(self.history_dir / "lab.jsonl", timeline.LAB_PROCESS)

    @property
    def client_bootstrap(self) -> str:
        return self.proxy.address

    @property
    def direct_bootstrap(self) -> str:
        return self.broker.address if self.broker is not None else str(self.scenario.bootstrap)

    def execute(self) -> RunResult:
        scenario = self.scenario
        fault_names = ", ".join(scenario.faults) or "none"
        self.log(f"{scenario.guarantee}: {scenario.messages} messages, faults {fault_names}")
        self._create_topics()
        plan = faults.schedule(scenario.faults, scenario.seed, scenario.produce_s, PRODUCERS, WORKERS)
        if not self.workers and any(event.action in AT_CONSUMERS for event in plan):
            plan = [event for event in plan if event.action not in AT_CONSUMERS]
            self.injected.append(f"no consumer to kill or pause: {scenario.guarantee} runs producers only")
        hangers: list[threading.Thread] = []
        try:
            for slot in range(self.workers):
                self._start(f"worker-{slot}")
            for slot in range(PRODUCERS):
                self._start(f"producer-{slot}")
            # The faults are timed from when every client is up, not from their spawn: on a busy
            # machine an interpreter takes seconds to start, and lost acks timed from the spawn
            # could be over before the first write.
            wait_until(
                lambda: all(map(self._up, self.processes)),
                CLIENT_START_TIMEOUT_S,
                what="every client to start (its history file to appear)",
            )
            started = time.monotonic()
            while plan or len(self.finished) < PRODUCERS:
                while plan and plan[0].at_s <= time.monotonic() - started:
                    event = plan.pop(0)
                    if self._starting(event):  # it could not yet take the signal: a little later
                        later = dataclasses.replace(event, at_s=event.at_s + 0.1)
                        bisect.insort(plan, later, key=lambda planned: planned.at_s)
                        continue
                    hangers += self._inject(event)
                self._supervise()
                if time.monotonic() - started > scenario.produce_s + DRAIN_TIMEOUT_S:
                    break
                time.sleep(0.05)
            for hanger in hangers:
                hanger.join(timeout=60)
            drained = self._drain(time.monotonic() + DRAIN_TIMEOUT_S)
            self._let_zombies_go_on(time.monotonic() + ZOMBIE_WAIT_S)
        finally:
            for process in [*self.processes.values(), *(zombie.process for zombie in self.zombies)]:
                _kill(process)
        self.fault_log.close()
        if scenario.broker_fault == "duplicate-produce":
            # The clients are gone; a copy sent on their way may still be stored, and counted then.
            wait_until(
                lambda: self.proxy.copies_unanswered == 0,
                COPY_ANSWER_WAIT_S,
                what="the broker's answers to the proxy's copies",
            )
        self._final_reads()
        effects = None
        if scenario.broker_fault is not None:
            effects = dataclasses.asdict(self.proxy.broker_faults)
            self._report_broker_fault()
        events = read_history(self.history_dir)
        result = check(events, self.input, self.output)
        counts = coverage.measure(
            events, self.input, self.proxy.acks_lost, self.broker_kills, self.proxy.requests_dropped
        )
        read_committed = self.preset.consumer["isolation.level"] == "read_committed"
        judged = coverage.verdicts(result, counts, read_committed)
        self.log(
            f"{scenario.guarantee}: produced {result.produced}, acknowledged {result.acknowledged}, "
            f"delivered {result.delivered}, lost {result.lost}, duplicated {result.duplicated}, "
            f"aborted reads {result.aborted_reads}; "
            + ", ".join(f"{anomaly} {verdict}" for anomaly, verdict in judged.items())
        )
        contexts = [timeline.context(events, anomaly.values) for anomaly in result.anomalies[:SHOWN_CONTEXTS]]
        drawn = timeline.build(events)
        metrics = self._broker_metrics()
        run = RunResult(
            scenario, result, drained, self.injected, counts, judged, effects, drawn, contexts, metrics
        )
        run.cross_check = log_agreement(events)
        run.transactions = outcomes(events)
        acknowledged = {event["value"] for event in events if event["type"] == "ack"}
        run.control = controls.judge(run.to_json(), acknowledged)
        if run.control is not None:
            self.log(f"{scenario.guarantee}: {controls.line(run.control)}")
        return run

    def _broker_metrics(self) -> BrokerMetrics | None:
        """The own broker's metrics since its last start (a broker kill resets them)."""
        if self.broker is None or self.broker.metrics_url is None:
            return None
        try:
            metrics = broker_metrics.scrape(self.broker.metrics_url)
        except OSError as error:  # the run's verdict does not depend on them
            self.log(f"{self.scenario.guarantee}: broker metrics unavailable: {error}")
            return None
        self.log(f"{self.scenario.guarantee}: broker {metrics.summary()}")
        return metrics

    def _create_topics(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.direct_bootstrap})
        cluster = admin.list_topics(timeout=30)
        topics = self.topics
        # librdkafka's mock cluster has no controller to answer CreateTopics; it creates a topic
        # (with partitions of its choosing) when a Metadata request names it.
        if cluster.controller_id in cluster.brokers:
            for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1) for topic in topics]).values():
                future.result(timeout=30)
        deadline = time.monotonic() + 30
        while len(self.partitions) < len(topics):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the topics {', '.join(topics)} never showed up in the metadata")
            for topic in topics:
                found = admin.list_topics(topic, timeout=30).topics.get(topic)
                if found is not None and found.error is None and found.partitions:
                    self.partitions[topic] = len(found.partitions)

    def _report_broker_fault(self) -> None:
        done = self.proxy.broker_faults
        self.injected.append(
            f"broker fault {self.scenario.broker_fault}: {done.fetches_rewritten} Fetch requests rewritten"
            f" to read_uncommitted, {done.produces_dropped} Produce requests acknowledged and dropped"
            f" ({len(done.dropped_values)} records), {done.produces_duplicated} duplicated"
            f" ({len(done.duplicated_values)} records)"
        )

    def _command(self, name: str, process: str) -> list[str]:
        role, slot = name.split("-")
        common = [
            "--bootstrap", self.client_bootstrap,
            "--history", str(self.history_dir / f"{process}.jsonl"),
            "--process", process,
            "--preset", self.preset.name,
            "--transactional-id", f"lab-{self.tag}-{name}",
        ]  # fmt: skip
        if role == "worker":
            return [role, *common, "--input", self.input, "--output", self.output, "--group", self.group,
                    "--slot", slot]  # fmt: skip
        share = self.scenario.messages // PRODUCERS + (int(slot) < self.scenario.messages % PRODUCERS)
        history = [e for e in read_history(self.history_dir) if e["process"].startswith(f"{name}.")]
        resend = unacknowledged(history) if self.preset.resends_unacknowledged else []
        return [
            role, *common, "--topic", self.input, "--prefix", f"p{self.tag}-{slot}",
            "--resend", ",".join(str(number) for number in resend),
            "--start", str(_next_number(history)), "--end", str(share),
            "--rate", str(max(share / self.scenario.produce_s, 1.0)),
            "--abort-rate", str(faults.ABORT_RATE if self.preset.transactional else 0.0),
            "--seed", str(self.scenario.seed),
        ]  # fmt: skip

    def _start(self, name: str) -> None:
        incarnation = self.incarnations.get(name, -1) + 1
        self.incarnations[name] = incarnation
        process = f"{name}.{incarnation}"
        with (self.logs_dir / f"{process}.log").open("w") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "onceflow.lab.workload", *self._command(name, process)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )

    def _supervise(self) -> None:
        """Starts again every client that died, as an orchestrator would; a producer exits 0 when done."""
        self._tend_zombies()
        for name, process in list(self.processes.items()):
            code = process.poll()
            if code is None or name in self.finished:
                continue
            if code == 0 and name.startswith("producer"):
                self.finished.add(name)
                continue
            self._start(name)

    def _tend_zombies(self) -> None:
        """A paused worker gets a successor (as an orchestrator that declared it dead would start
        one), and goes on once the successor has its partitions: a zombie."""
        now = time.monotonic()
        for zombie in self.zombies:
            if zombie.state == "signaled" and self._recorded(zombie.incarnation, "pause"):
                self._start(zombie.name)
                zombie.successor = f"{zombie.name}.{self.incarnations[zombie.name]}"
                zombie.state, zombie.since = "replaced", now
            elif zombie.state == "signaled" and zombie.process.poll() is not None:
                zombie.state = "gone"  # it died on its own before pausing: restarted as any other
            elif zombie.state == "replaced" and (
                self._recorded(zombie.successor, "assign") or now - zombie.since > ZOMBIE_WAIT_S
            ):
                zombie.process.send_signal(signal.SIGCONT)
                self.fault_log.record("fault", action="resume-consumer", target=zombie.name)
                zombie.state = "resumed"
                self.injected.append(f"SIGCONT {zombie.incarnation} after {zombie.successor} started")

    def _let_zombies_go_on(self, deadline: float) -> None:
        """A run can drain while a zombie waits for its SIGCONT, or before a resumed one got a
        core: it would then be killed before doing what makes it a zombie. So each one is
        resumed, and goes on past its `resume`, or exits, before the run ends (or the deadline)."""
        while time.monotonic() < deadline:
            self._tend_zombies()
            if all(
                zombie.state in ("signaled", "gone")
                or zombie.process.poll() is not None
                or (zombie.state == "resumed" and self._went_on(zombie.incarnation))
                for zombie in self.zombies
            ):
                return
            time.sleep(0.05)

    def _went_on(self, process: str) -> bool:
        """The process recorded something after its `resume`."""
        path = self.history_dir / f"{process}.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        resumed = [index for index, line in enumerate(lines) if '"type":"resume"' in line]
        return bool(resumed) and resumed[-1] < len(lines) - 1

    def _recorded(self, process: str, kind: str) -> bool:
        path = self.history_dir / f"{process}.jsonl"
        return path.exists() and f'"type":"{kind}"' in path.read_text(encoding="utf-8")

    def _starting(self, event: faults.FaultEvent) -> bool:
        """A client the event signals that has not yet created its history file (see
        `workload.CrashPoints`), so would die of the signal at a point nobody chose."""
        if event.action not in SIGNALED:
            return False
        name = f"{'producer' if event.action == 'kill-producer' else 'worker'}-{event.target}"
        return name not in self.finished and not self._up(name)

    def _up(self, name: str) -> bool:
        """The client's current incarnation has created its history file (it takes signals from
        then on), or has exited."""
        history = self.history_dir / f"{name}.{self.incarnations[name]}.jsonl"
        return self.processes[name].poll() is not None or history.exists()

    def _inject(self, event: faults.FaultEvent) -> list[threading.Thread]:
        action = event.action
        if action not in SIGNALED:  # those are written down only if the client was there to signal
            self.fault_log.record("fault", action=action, target=event.target)
        if action in ("lose-acks", "stop-losing-acks"):
            on = action == "lose-acks"
            self.proxy.plan.drop_response_probability = faults.DROP_PROBABILITY if on else 0.0
            self.proxy.plan.drop_write_response_probability = faults.DROP_WRITE_PROBABILITY if on else 0.0
            self.proxy.plan.delay_response_s = faults.RESPONSE_DELAY_S if on else 0.0
            self.proxy.plan.max_faults = faults.MAX_DROPPED
            self.injected.append(f"{event.at_s:.1f}s {action}")
            if not on:
                self.injected.append(f"proxy destroyed {self.proxy.responses_dropped} responses")
                # A loaded machine, or clients killed in the window, may have answered no write
                # in it: then lose the next answer to one, so that the run tests what it is for.
                if self.proxy.acks_lost == 0:
                    self.proxy.plan.drop_next_write_response = True
                    self.injected.append("no answer to a write lost yet: the proxy destroys the next one")
        elif action in ("lose-requests", "stop-losing-requests"):
            on = action == "lose-requests"
            self.proxy.plan.drop_produce_request_probability = faults.DROP_PROBABILITY if on else 0.0
            self.proxy.plan.max_faults = faults.MAX_DROPPED
            # A loaded machine may have sent little in the window: then lose the next request, so
            # that the run still tests what it is for.
            self.proxy.plan.drop_next_produce_request = not on and self.proxy.requests_dropped == 0
            self.injected.append(f"{event.at_s:.1f}s {action}")
            if not on:
                self.injected.append(f"proxy destroyed {self.proxy.requests_dropped} Produce requests")
        elif action in ("kill-producer", "kill-consumer"):
            # The process SIGKILLs itself at its next crash point (see `workload.CrashPoints`).
            name = f"{'producer' if action == 'kill-producer' else 'worker'}-{event.target}"
            if name not in self.finished and self.processes[name].poll() is None:
                self.processes[name].send_signal(event.crash_signal)
                self.fault_log.record("fault", action=action, target=event.target)
                point = "second" if event.crash_signal == faults.CRASH_SIGNALS[1] else "next"
                self.injected.append(
                    f"{event.at_s:.1f}s SIGKILL {name}.{self.incarnations[name]} at its {point} crash point"
                )
        elif action == "pause-consumer":
            name = f"worker-{event.target}"
            process = self.processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGURG)  # it stops itself at its crash point
                self.fault_log.record("fault", action=action, target=event.target)
                incarnation = f"{name}.{self.incarnations[name]}"
                self.zombies.append(_Zombie(name, process, incarnation))
                self.injected.append(f"{event.at_s:.1f}s pause {incarnation} at its next crash point")
        elif action == "kill-broker" and self.broker is not None:
            self.broker.kill()
            self.broker_kills += 1
            self.injected.append(f"{event.at_s:.1f}s SIGKILL broker")
            time.sleep(self.rng.uniform(0.5, 1.5))  # clients keep sending into the void meanwhile
            self.broker.start()
            self.fault_log.record("fault", action="restart-broker")
        elif action == "hang-transaction":
            hanger = threading.Thread(target=self._hang, args=(event.at_s,))
            hanger.start()
            return [hanger]
        return []

    def _hang(self, at_s: float) -> None:
        """A transactional producer killed mid-transaction: only the broker's timeout can end it."""
        process = "hanger.0"
        command = [
            sys.executable, "-m", "onceflow.lab.workload", "hanger",
            "--bootstrap", self.client_bootstrap, "--history", str(self.history_dir / f"{process}.jsonl"),
            "--process", process, "--topic", self.input, "--prefix", f"h{self.tag}",
            "--start", "0", "--end", "10", "--transactional-id", f"lab-{self.tag}-hanger",
            "--timeout-ms", str(faults.HANGING_TIMEOUT_MS),
        ]  # fmt: skip
        with (self.logs_dir / f"{process}.log").open("w") as log:
            hanger = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        assert hanger.stdout is not None
        opened = hanger.stdout.readline().strip() == "open"
        _kill(hanger)
        self.injected.append(
            f"{at_s:.1f}s SIGKILL hanger mid-transaction" + ("" if opened else " (never opened)")
        )

    def _drain(self, deadline: float) -> bool:
        """Waits until the group has committed past the last record a reader at its level can see,
        and no transaction holds the LSO back."""
        isolation = str(self.preset.consumer["isolation.level"])
        partitions = self.partitions[self.input]
        progress: dict[int, int] = {}
        progress_at = time.monotonic()
        while time.monotonic() < deadline:
            self._supervise()
            bootstrap = self.direct_bootstrap
            try:
                records, committed_ends = read_topic(bootstrap, self.input, partitions, "read_committed")
                if isolation != "read_committed":
                    records = read_topic(bootstrap, self.input, partitions, isolation)[0]
                committed = self._committed() if self.workers else {}
                settled = {p: end for p, end in committed_ends} == self._high_watermarks()
            except (KafkaException, TimeoutError) as error:  # a broker restarting: asked again
                self.log(f"{self.scenario.guarantee}: drain probe failed, asking again: {error}")
                time.sleep(0.5)
                continue
            last = {p: o for p, o, _v in records}  # records come in offset order per partition
            if settled and all(committed.get(p, -1) > o for p, o in last.items() if self.workers):
                return True
            if committed != progress:
                progress, progress_at = committed, time.monotonic()
            elif time.monotonic() - progress_at > STALL_S:
                # A liveness probe, as an orchestrator has: it kills, and _supervise starts again.
                for name, process in self.processes.items():
                    if name.startswith("worker"):
                        _kill(process)
                self.injected.append(f"workers stalled {STALL_S:.0f}s after the faults: SIGKILL, restart")
                progress_at = time.monotonic()
            time.sleep(0.5)
        self.log(f"{self.scenario.guarantee}: the workers did not catch up in time")
        return False

    def _committed(self) -> dict[int, int]:
        consumer = Consumer({"bootstrap.servers": self.direct_bootstrap, "group.id": self.group})
        try:
            partitions = range(self.partitions[self.input])
            found = consumer.committed([TopicPartition(self.input, p) for p in partitions], timeout=10)
            return {tp.partition: tp.offset for tp in found}
        finally:
            consumer.close()

    def _high_watermarks(self) -> dict[int, int]:
        # librdkafka's consumers default to read_committed, whose "high" watermark is the LSO: with
        # that, a hanging transaction would look drained while it still held the workers back.
        consumer = Consumer(
            {
                "bootstrap.servers": self.direct_bootstrap,
                "group.id": self.group,
                "isolation.level": "read_uncommitted",
            }
        )
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(self.input, p), timeout=10)[1]
                for p in range(self.partitions[self.input])
            }
        finally:
            consumer.close()

    def _final_reads(self) -> None:
        """Both topics at both isolation levels, straight from the broker; under `serve-aborted`
        through the proxy, fault on, as a broker whose read_committed is broken would serve them:
        then only the history knows which records were aborted."""
        serving_aborted = self.scenario.broker_fault == "serve-aborted"
        bootstrap = self.client_bootstrap if serving_aborted else self.direct_bootstrap
        if not serving_aborted:
            self.proxy.plan.broker_fault = None
        reader = HistoryWriter(self.history_dir / "final-read.jsonl", "final-read")
        for topic in self.topics:
            for isolation in ("read_committed", "read_uncommitted"):
                records, ends = read_topic(bootstrap, topic, self.partitions[topic], isolation)
                reader.record("read", topic=topic, isolation=isolation, records=records, ends=ends)
        reader.close()


def read_topic(
    bootstrap: str, topic: str, partitions: int, isolation: str, timeout_s: float = 30
) -> tuple[list[list[Any]], list[list[int]]]:
    """Every record of `topic` from offset 0 to its end at this isolation level, as
    [partition, offset, value] in offset order, and each partition's end offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "lab-final-read",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[list[Any]] = []
    ends: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(ends) < partitions and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.2):
                error = message.error()
                if error is None:
                    value = message.value()
                    text = value.decode() if isinstance(value, bytes) else str(value)
                    records.append([message.partition(), message.offset(), text])
                elif error.code() == KafkaError._PARTITION_EOF:
                    ends[message.partition() or 0] = message.offset() or 0
    finally:
        consumer.close()
    if len(ends) < partitions:
        raise TimeoutError(f"{topic}: did not reach the end of every partition in {timeout_s}s")
    return records, sorted([p, end] for p, end in ends.items())


def _next_number(history: list[Event]) -> int:
    """A restarted producer goes on after the last value its predecessors sent."""
    return max((_number(event["value"]) for event in history if event["type"] == "send"), default=-1) + 1


def unacknowledged(history: list[Event]) -> list[int]:
    """The numbers of the values a producer's predecessors sent and never saw settled: neither
    acknowledged nor failed, nor in a transaction that ended or whose commit they asked for (it
    may have landed), in the order sent. A restarted at-least-once producer sends them again."""
    sent = list(dict.fromkeys(event["value"] for event in history if event["type"] == "send"))
    settled = {event["value"] for event in history if event["type"] in ("ack", "fail")}
    settled |= {value for event in history if event["type"] == "txn" for value in event["values"]}
    transactions = fates(history)
    for fate in ("committed", "unknown"):
        settled |= {value for values in transactions.values[fate].values() for value in values}
    return [_number(value) for value in sent if value not in settled]


def _number(value: str) -> int:
    return int(value.rsplit("-", 1)[1])


def _kill(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
