"""The benchmark scenarios. Each runs onceflow and its reference side by side and returns rows.

A row is one onceflow figure, the reference figure measured in the same run (the librdkafka
mock cluster, the disk's dd bandwidth, the same broker with an empty data directory, the
same broker without transactions, or one broker against a replicated cluster) and their
ratio, so a noisy shared machine slows both sides of a comparison alike.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from processes import (
    QUIX_SCRIPT,
    SPARK_JOB_SCRIPT,
    BenchmarkError,
    BrokerProcess,
    OnceflowCluster,
    ScriptSession,
    delete_topic,
    mock_broker,
    onceflow_broker,
    run_client,
    run_script,
    stage_times,
)
from quixstreams_venv import QUIXSTREAMS_VERSION, VENV_DIR, VenvUnavailable, quixstreams_python
from rich.console import Console

from onceflow.cluster.launcher import SESSION_TIMEOUT_MS, LaunchError, wait_registered
from onceflow.cluster.zk import read_cluster
from onceflow.internal_topics import TRANSACTION_LOG

T = TypeVar("T")
MB = 1_000_000  # decimal megabytes, as dd reports them
RECORD_SIZES = (1000, 100)
THROUGHPUT_PARTITIONS = 4  # the mock cluster auto-creates topics with 4 partitions
STORAGE_PARTITIONS = 100
# Also in --quick: smaller writes can end in a cache below the filesystem and overstate the disk.
DD_MIB = 1024
LATENCY_RATE_BYTES = 10 * MB
# The mock answers a fetch that finds no data only after fetch.wait.max.ms (new data does not
# wake it), so the consumer's wait bounds the reference's latency; keep it small.
LATENCY_FETCH_WAIT_MS = 5
TRANSACTION_RECORD_SIZE = 1000
COMMIT_INTERVAL_MS = 100
ABORT_EVERY = 10  # in the log read by both isolation levels, so read_committed has aborts to skip
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
SPARK_RECORD_SIZE = 100
UNREPLICATED_LATENCY_TOPIC = "replication-latency-rf1"
CLUSTER_SIZE = 3  # `onceflow cluster run`'s default replication factor is min(3, brokers)
FAILOVER_PARTITION = 0
FAILOVER_INTERVAL_MS = 5  # the steady producer's pace during a failover: 200 records/s
FAILOVER_WARMUP_SECONDS = 2.0
SCRAM_CONNECTIONS = 50
SCRAM_ITERATIONS = 4096  # Kafka's default and least
BENCH_ADMIN = ("admin", "admin-secret")
COORDINATOR_FAILOVER_INTERVAL_MS = 20  # a transaction of one record per interval


@dataclass(frozen=True)
class Sizes:
    produce_bytes: dict[int, int]  # record size -> bytes to produce
    latency_seconds: float
    latency_warmup_seconds: float
    fill_bytes: int
    transactional_produce_bytes: int  # per run, for the idempotent and the transactional producer
    isolation_log_bytes: int  # the transactional log both isolation levels read
    # Runs of each side of a transactions comparison, alternating, so that the disk's
    # slow spells hit both sides; the rows show the medians.
    rounds: int
    spark_records: int  # 100-byte records in the topic the Spark queries and reads consume
    spark_max_offsets_per_trigger: int


FULL = Sizes(
    produce_bytes={1000: 500 * MB, 100: 100 * MB},
    latency_seconds=10.0,
    latency_warmup_seconds=1.0,
    fill_bytes=1000 * MB,
    transactional_produce_bytes=500 * MB,
    isolation_log_bytes=1000 * MB,
    rounds=3,
    spark_records=1_000_000,
    spark_max_offsets_per_trigger=30_000,
)
QUICK = Sizes(
    produce_bytes={1000: 200 * MB, 100: 20 * MB},
    latency_seconds=2.0,
    latency_warmup_seconds=0.5,
    fill_bytes=100 * MB,
    transactional_produce_bytes=100 * MB,
    isolation_log_bytes=100 * MB,
    rounds=2,
    spark_records=12_000,
    spark_max_offsets_per_trigger=4_000,
)


@dataclass(frozen=True)
class Target:
    text: str
    on_ratio: bool  # compare the ratio (at least `limit`) instead of the onceflow figure (under `limit`)
    limit: float
    ratio_at_most: bool = False  # the ratio must be at most `limit` (a cost, not a speed)

    def met(self, onceflow: float, ratio: float) -> bool:
        if not self.on_ratio:
            return onceflow < self.limit
        return ratio <= self.limit if self.ratio_at_most else ratio >= self.limit


# Issue 10's targets; the first bench had 0.5 x dd, none against the mock, and 1 x produce.
PRODUCE_VS_DISK = Target("ratio ≥ 0.7", on_ratio=True, limit=0.7)
PRODUCE_VS_MOCK = Target("ratio ≥ 0.8", on_ratio=True, limit=0.8)
CONSUME_VS_PRODUCE = Target("ratio ≥ 1.5", on_ratio=True, limit=1.5)
LATENCY_P99 = Target("< 10 ms", on_ratio=False, limit=10.0)
RESTART = Target("< 3 s", on_ratio=False, limit=3.0)
RSS = Target("< 200 MB", on_ratio=False, limit=200.0)
TRANSACTIONAL_VS_IDEMPOTENT = Target("ratio ≥ 0.95", on_ratio=True, limit=0.95)
COMMITTED_VS_UNCOMMITTED = Target("ratio ≥ 0.95", on_ratio=True, limit=0.95)
EXACTLY_ONCE_VS_AT_LEAST_ONCE = Target("ratio ≥ 0.95", on_ratio=True, limit=0.95)
SPARK_VS_QUIXSTREAMS = Target("ratio ≥ 1.25", on_ratio=True, limit=1.25)
SPARK_READ_VS_CONSUMER = Target("ratio ≥ 0.8", on_ratio=True, limit=0.8)
SPARK_FIRST_READ_VS_CONSUMER = Target("ratio ≥ 0.5", on_ratio=True, limit=0.5)
BOUNDS_CHECK_COST = Target("ratio ≥ 0.97", on_ratio=True, limit=0.97)
REPLICATED_VS_SINGLE_PRODUCE = Target("ratio ≥ 0.5", on_ratio=True, limit=0.5)
REPLICATED_VS_SINGLE_CPU = Target("ratio ≤ 3.0", on_ratio=True, limit=3.0, ratio_at_most=True)
FAILOVER = Target("< 5 s", on_ratio=False, limit=5.0)
# Issue 37: exactly-once moves again within 10 s of its coordinator's SIGKILL.
COORDINATOR_FAILOVER = Target("< 10 s", on_ratio=False, limit=10.0)
REPLICATED_VS_SINGLE_LATENCY = Target("ratio ≤ 2", on_ratio=True, limit=2.0, ratio_at_most=True)
TLS_VS_PLAINTEXT = Target("ratio ≥ 0.6", on_ratio=True, limit=0.6)
SCRAM_LOGIN = Target("≤ 50 ms", on_ratio=False, limit=50.0)
TARGETS = {
    "produce 1 KB records, MB/s, vs dd fdatasync": PRODUCE_VS_DISK,
    "produce 1 KB records, MB/s, vs the mock cluster": PRODUCE_VS_MOCK,
    "consume MB/s vs produce MB/s, per record size": CONSUME_VS_PRODUCE,
    "produce-to-consume p99 at 10 MB/s, ms": LATENCY_P99,
    "restart with 1 GB of log, after SIGTERM and after SIGKILL, s": RESTART,
    "broker RSS with 100 partitions and 1 GB on disk, MB": RSS,
    "transactional produce MB/s, 1 KB records, a commit every 100 ms, vs idempotent": (
        TRANSACTIONAL_VS_IDEMPOTENT
    ),
    "read_committed vs read_uncommitted, time to the end of the same log": COMMITTED_VS_UNCOMMITTED,
    "Spark query records/s, exactly-once sink vs at-least-once": EXACTLY_ONCE_VS_AT_LEAST_ONCE,
    "Spark query records/s vs quixstreams, both exactly-once, same transform and records": (
        SPARK_VS_QUIXSTREAMS
    ),
    "Spark batch read records/s, values aggregated, after 4 reads, vs a read_committed confluent-kafka"
    " consumer": SPARK_READ_VS_CONSUMER,
    "Spark batch read records/s, values aggregated, first in a session after one small read, vs a"
    " read_committed confluent-kafka consumer": SPARK_FIRST_READ_VS_CONSUMER,
    "produce with the request bounds check vs without (MB/s, and MB per broker CPU second)": (
        BOUNDS_CHECK_COST
    ),
    "produce MB/s, 1 KB records, 3 brokers with replication factor 3 vs one broker": (
        REPLICATED_VS_SINGLE_PRODUCE
    ),
    "brokers' CPU per acknowledged MB, 1 KB records, 3 brokers with replication factor 3 vs one broker": (
        REPLICATED_VS_SINGLE_CPU
    ),
    "failover: leader SIGKILLed to the first ack by a new leader, s": FAILOVER,
    "coordinator failover: its broker SIGKILLed to the next committed transaction, s": COORDINATOR_FAILOVER,
    "produce-to-consume p99 at 10 MB/s, 3 brokers with replication factor 3 vs one broker": (
        REPLICATED_VS_SINGLE_LATENCY
    ),
    "produce MB/s, 1 KB records, over TLS vs plaintext": TLS_VS_PLAINTEXT,
    "SCRAM authentication of one connection at 4,096 iterations, ms": SCRAM_LOGIN,
}


@dataclass(frozen=True)
class Row:
    scenario: str
    unit: str
    onceflow: float
    reference: float | None  # None when the reference was skipped
    reference_name: str
    target: Target | None = None
    skipped: str = ""  # why the reference did not run, e.g. its venv could not be made
    # (onceflow, reference) of each round, the two sides run alternately: the ratio is then the
    # median of the rounds' ratios, `onceflow` and `reference` the medians of each side's figures.
    rounds: tuple[tuple[float, float], ...] = ()

    @property
    def round_ratios(self) -> list[float]:
        return [ours / theirs for ours, theirs in self.rounds]

    @property
    def ratio(self) -> float | None:
        if self.reference is None:
            return None
        return statistics.median(self.round_ratios) if self.rounds else self.onceflow / self.reference

    @property
    def spread(self) -> tuple[float, float] | None:
        """The lowest and highest of the rounds' ratios."""
        ratios = self.round_ratios
        return (min(ratios), max(ratios)) if len(ratios) > 1 else None

    @property
    def passed(self) -> bool | None:
        if self.target is None or self.ratio is None:
            return None
        return self.target.met(self.onceflow, self.ratio)

    def as_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "ratio": self.ratio,
            "round_ratios": self.round_ratios,
            "spread": self.spread,
            "passed": self.passed,
        }


def paired_row(
    scenario: str,
    unit: str,
    rounds: list[tuple[float, float]],
    reference_name: str,
    target: Target | None = None,
) -> Row:
    """A row of alternating rounds: (onceflow, reference) figures per round."""
    return Row(
        scenario,
        unit,
        statistics.median(ours for ours, _ in rounds),
        statistics.median(theirs for _, theirs in rounds),
        reference_name,
        target,
        rounds=tuple(rounds),
    )


class Reachable(Protocol):
    """A broker or a cluster, as a client sees it."""

    @property
    def name(self) -> str: ...

    @property
    def bootstrap(self) -> str: ...


@dataclass
class Outcome:
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    rows: list[Row] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """What every scenario needs: where to put files, how big to go, where to report progress."""

    work_dir: Path
    sizes: Sizes
    console: Console

    def step(self, text: str) -> None:
        self.console.print(f"[dim]  {text}[/dim]")

    def new_dir(self, name: str) -> Path:
        path = self.work_dir / name
        path.mkdir()
        return path

    def client(self, command: str, timeout_s: float, **options: Any) -> dict[str, Any]:
        return run_client(command, options, timeout_s, self.work_dir)


def throughput(run: Run) -> Outcome:
    """Per round: dd's fdatasync bandwidth, then produce and consume through onceflow and the
    mock cluster in turn."""
    outcome = Outcome()
    disks: list[dict[str, Any]] = []
    produced: dict[int, dict[str, list[dict[str, Any]]]] = {
        size: {"onceflow": [], "mock": []} for size in RECORD_SIZES
    }
    consumed: dict[int, dict[str, list[dict[str, Any]]]] = {
        size: {"onceflow": [], "mock": []} for size in RECORD_SIZES
    }
    with (
        onceflow_broker(
            run.new_dir("throughput-data"), {"num.partitions": str(THROUGHPUT_PARTITIONS)}, run.work_dir
        ) as onceflow,
        mock_broker(run.work_dir) as mock,
    ):
        onceflow.start()
        mock.start()
        for number in range(1, run.sizes.rounds + 1):
            disks.append(measure_disk(run))
            brokers = _in_turn([("onceflow", onceflow), ("mock", mock)], number)
            for record_size in RECORD_SIZES:
                for name, broker in brokers:
                    produced[record_size][name].append(
                        _produce(
                            run,
                            broker,
                            f"produce-{record_size}",
                            record_size,
                            run.sizes.produce_bytes[record_size],
                        )
                    )
            for record_size in RECORD_SIZES:
                for name, broker in brokers:
                    consumed[record_size][name].append(_consume(run, broker, record_size))
        onceflow.stop()
        mock.stop()
    outcome.figures.update({"disk": disks, "produce": produced, "consume": consumed})

    def rounds(
        ours: list[dict[str, Any]], theirs: list[dict[str, Any]], key: str = "mb_per_s"
    ) -> list[tuple[float, float]]:
        return [(mine[key], other[key]) for mine, other in zip(ours, theirs, strict=True)]

    for record_size in RECORD_SIZES:
        label = _record_label(record_size)
        sides = produced[record_size]
        outcome.rows.append(
            paired_row(
                f"produce {label} records",
                "MB/s",
                rounds(sides["onceflow"], sides["mock"]),
                "mock",
                PRODUCE_VS_MOCK if record_size == 1000 else None,
            )
        )
        if record_size == 1000:
            outcome.rows.append(
                paired_row(
                    f"produce {label} vs disk",
                    "MB/s",
                    rounds(sides["onceflow"], disks),
                    "dd fdatasync",
                    PRODUCE_VS_DISK,
                )
            )
    for record_size in RECORD_SIZES:
        label = _record_label(record_size)
        sides = consumed[record_size]
        outcome.rows.append(
            paired_row(f"consume {label} records", "MB/s", rounds(sides["onceflow"], sides["mock"]), "mock")
        )
        outcome.rows.append(
            paired_row(
                f"consume {label} vs produce",
                "MB/s",
                rounds(sides["onceflow"], produced[record_size]["onceflow"]),
                "onceflow produce",
                CONSUME_VS_PRODUCE,
            )
        )
    return outcome


def measure_disk(run: Run) -> dict[str, Any]:
    """Sequential write bandwidth with one fdatasync at the end, on the data dirs' filesystem."""
    target = run.work_dir / "dd.bin"
    run.step(f"dd {DD_MIB} MiB conv=fdatasync into {run.work_dir}")
    command = ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={DD_MIB}", "conv=fdatasync"]
    try:
        finished = subprocess.run(
            command, capture_output=True, text=True, timeout=300, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}
        )
    finally:
        target.unlink(missing_ok=True)
    # e.g. "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 3.54581 s, 303 MB/s"
    match = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", finished.stderr, re.MULTILINE)
    if finished.returncode != 0 or match is None:
        raise BenchmarkError(f"dd failed ({finished.returncode}): {finished.stderr.strip()}")
    written, seconds = int(match.group(1)), float(match.group(2))
    return {
        "command": " ".join(command),
        "bytes": written,
        "seconds": seconds,
        "mb_per_s": written / seconds / MB,
    }


def _produce(
    run: Run,
    broker: Reachable,
    topic: str,
    record_size: int,
    total_bytes: int,
    commit_interval_ms: int = 0,
    abort_every: int = 0,
    client_config: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Produce to a 4-partition topic, acks=all, linger.ms=5: idempotent, or in transactions;
    `client_config` adds librdkafka settings (TLS, say)."""
    records = total_bytes // record_size
    mode = f"a commit every {commit_interval_ms} ms" if commit_interval_ms else "idempotent"
    if abort_every:
        mode += f", every {abort_every}th transaction aborted"
    run.step(f"produce {records:,} x {record_size} B, acks=all, {mode}, linger.ms=5 -> {broker.name} {topic}")
    figures = run.client(
        "produce",
        timeout_s=600,
        bootstrap=broker.bootstrap,
        topic=topic,
        partitions=THROUGHPUT_PARTITIONS,
        record_size=record_size,
        records=records,
        linger_ms=5,
        commit_interval_ms=commit_interval_ms,
        abort_every=abort_every,
        client_config=json.dumps(client_config or {}),
    )
    return _with_rates(figures)


def _consume(run: Run, broker: BrokerProcess, record_size: int) -> dict[str, Any]:
    wanted = run.sizes.produce_bytes[record_size]
    run.step(f"consume {wanted / MB:,.0f} MB of {record_size} B records <- {broker.name}")
    figures = run.client(
        "consume",
        timeout_s=600,
        bootstrap=broker.bootstrap,
        topic=f"produce-{record_size}",
        partitions=THROUGHPUT_PARTITIONS,
        min_bytes=wanted,
    )
    return _with_rates(figures)


def latency(run: Run) -> Outcome:
    """Produce-to-consume latency at a steady 10 MB/s of 1 KB records, acks=all, linger.ms=0;
    then where onceflow's time went, per stage, from its own metrics."""
    outcome = Outcome()
    with (
        onceflow_broker(
            run.new_dir("latency-data"),
            {"num.partitions": str(THROUGHPUT_PARTITIONS)},
            run.work_dir,
            metrics=True,
        ) as onceflow,
        mock_broker(run.work_dir) as mock,
    ):
        onceflow.start()
        mock.start()
        timed: dict[str, list[dict[str, Any]]] = {"onceflow": [], "mock": []}
        for number in range(1, run.sizes.rounds + 1):
            for name, broker in _in_turn([("onceflow", onceflow), ("mock", mock)], number):
                timed[name].append(_steady_latency(run, broker, "latency"))
        stages = outcome.figures["onceflow_stages"] = stage_times(onceflow.metrics_url)
        onceflow.stop()
        mock.stop()
    outcome.figures.update(timed)
    outcome.figures["fetch_wait_max_ms"] = LATENCY_FETCH_WAIT_MS
    _print_stages(run, stages, statistics.median(figures["p99_ms"] for figures in timed["onceflow"]))
    for key, text, target in (
        ("p50_ms", "p50", None),
        ("p99_ms", "p99", LATENCY_P99),
        ("max_ms", "max", None),
    ):
        pairs = [
            (ours[key], theirs[key]) for ours, theirs in zip(timed["onceflow"], timed["mock"], strict=True)
        ]
        outcome.rows.append(paired_row(f"latency {text} at 10 MB/s", "ms", pairs, "mock", target))
    return outcome


def _steady_latency(run: Run, broker: Reachable, topic: str) -> dict[str, Any]:
    """`client.py latency`: produce-to-consume times at a steady 10 MB/s, 1 KB records, acks=all."""
    run.step(f"{run.sizes.latency_seconds:.0f} s at {LATENCY_RATE_BYTES / MB:.0f} MB/s -> {broker.name}")
    return run.client(
        "latency",
        timeout_s=run.sizes.latency_seconds + 120,
        bootstrap=broker.bootstrap,
        topic=topic,
        partitions=THROUGHPUT_PARTITIONS,
        rate_bytes=LATENCY_RATE_BYTES,
        seconds=run.sizes.latency_seconds,
        warmup_seconds=run.sizes.latency_warmup_seconds,
        fetch_wait_ms=LATENCY_FETCH_WAIT_MS,
    )


def _print_stages(run: Run, stages: dict[str, dict[str, float]], end_to_end_p99_ms: float) -> None:
    """One line per stage: its times, its share of the stages' summed means, its p99 against
    the end-to-end p99 (warm-up included: the broker cannot tell it apart)."""
    total_mean_ms = sum(times["mean_ms"] for times in stages.values())
    run.step("onceflow time per stage (ms; p50/p99 to their histogram bucket's upper bound):")
    for stage, times in stages.items():
        run.step(
            f"  {stage:<19} n={times['count']:<7.0f} mean {times['mean_ms']:7.3f}"
            f"  p50 ≤ {times['p50_ms']:g}  p99 ≤ {times['p99_ms']:g}"
            f"  share of means {times['mean_ms'] / total_mean_ms:5.2f}"
            f"  p99 / end-to-end p99 {times['p99_ms'] / end_to_end_p99_ms:5.2f}"
        )


def restart(run: Run) -> Outcome:
    """Fill 100 partitions with ~1 GB, time restarts after SIGKILL and after SIGTERM, read RSS.

    The filling broker writes no recovery checkpoint (its checkpoint interval is an hour), so
    the restart after SIGKILL must verify the whole log: the worst case. Both restarts are
    compared with a start on an empty data directory, which is mostly the interpreter's own
    start-up; RSS is compared with that empty broker's.
    """
    outcome = Outcome()
    figures = outcome.figures
    settings = {"num.partitions": str(STORAGE_PARTITIONS)}
    with onceflow_broker(run.new_dir("empty-data"), settings, run.work_dir) as broker:
        run.step("start on an empty data dir")
        figures["empty_start_s"] = broker.start()
        figures["empty_memory"] = broker.memory()
        broker.stop()

    data_dir = run.new_dir("storage-data")
    no_checkpoint = {**settings, "log.flush.interval.ms": "3600000"}
    with onceflow_broker(data_dir, no_checkpoint, run.work_dir) as broker:
        broker.start()
        records = run.sizes.fill_bytes // 1000
        run.step(f"fill {records:,} x 1000 B over {STORAGE_PARTITIONS} partitions -> {broker.name}")
        figures["fill"] = _with_rates(
            run.client(
                "produce",
                timeout_s=900,
                bootstrap=broker.bootstrap,
                topic="storage",
                partitions=STORAGE_PARTITIONS,
                record_size=1000,
                records=records,
                linger_ms=20,
            )
        )
        broker.kill()
    figures["bytes_on_disk"] = _bytes_under(data_dir)
    figures["records_checkpointed_at_kill"] = _checkpointed_records(data_dir)

    with onceflow_broker(data_dir, settings, run.work_dir) as broker:
        run.step("restart after SIGKILL")
        figures["restart_after_kill_s"] = broker.start()
        figures["shutdown_s"] = broker.stop()
        run.step("restart after SIGTERM")
        figures["restart_after_term_s"] = broker.start()
        figures["memory_after_restart"] = broker.memory()
        run.step(f"read all {STORAGE_PARTITIONS} partitions back <- {broker.name}")
        figures["read"] = _with_rates(
            run.client(
                "consume",
                timeout_s=900,
                bootstrap=broker.bootstrap,
                topic="storage",
                partitions=STORAGE_PARTITIONS,
                min_bytes=1,
            )
        )
        figures["memory_after_read"] = broker.memory()
        broker.stop()

    on_disk = f"{figures['bytes_on_disk'] / MB:,.0f} MB"
    empty_rss = figures["empty_memory"]["VmRSS"] / MB
    outcome.rows += [
        Row(
            f"restart after SIGKILL, {on_disk}, no checkpoint",
            "s",
            figures["restart_after_kill_s"],
            figures["empty_start_s"],
            "empty dir",
            RESTART,
        ),
        Row(
            f"restart after SIGTERM, {on_disk}",
            "s",
            figures["restart_after_term_s"],
            figures["empty_start_s"],
            "empty dir",
            RESTART,
        ),
        Row(
            f"RSS after restart, {STORAGE_PARTITIONS} partitions",
            "MB",
            figures["memory_after_restart"]["VmRSS"] / MB,
            empty_rss,
            "empty dir",
            RSS,
        ),
        Row(
            f"peak RSS after reading {on_disk}",
            "MB",
            figures["memory_after_read"]["VmHWM"] / MB,
            empty_rss,
            "empty dir",
            RSS,
        ),
    ]
    return outcome


def transactions(run: Run) -> Outcome:
    """An idempotent and a transactional producer, alternately, each at its maximum rate.

    The transactional one commits once its transaction is 100 ms old, so its figure includes
    waiting for every commit: the producer's queue drains before each one.
    """
    outcome = Outcome()
    produced: dict[str, list[dict[str, Any]]] = {"idempotent": [], "transactional": []}
    with onceflow_broker(
        run.new_dir("transactions-data"), {"num.partitions": str(THROUGHPUT_PARTITIONS)}, run.work_dir
    ) as broker:
        broker.start()
        for round_number in range(1, run.sizes.rounds + 1):
            modes = [("idempotent", 0), ("transactional", COMMIT_INTERVAL_MS)]
            for mode, commit_interval_ms in _in_turn(modes, round_number):
                produced[mode].append(
                    _produce(
                        run,
                        broker,
                        f"{mode}-{round_number}",
                        TRANSACTION_RECORD_SIZE,
                        run.sizes.transactional_produce_bytes,
                        commit_interval_ms,
                    )
                )
        broker.stop()
    medians = {
        mode: statistics.median(figures["mb_per_s"] for figures in runs) for mode, runs in produced.items()
    }
    outcome.figures = {**produced, "median_mb_per_s": medians, "commit_interval_ms": COMMIT_INTERVAL_MS}
    commits = "/".join(str(figures["transactions_committed"]) for figures in produced["transactional"])
    record_label = _record_label(TRANSACTION_RECORD_SIZE)
    outcome.rows.append(
        paired_row(
            f"produce {record_label}, {COMMIT_INTERVAL_MS} ms txns ({commits} commits)",
            "MB/s",
            [
                (transactional["mb_per_s"], idempotent["mb_per_s"])
                for transactional, idempotent in zip(
                    produced["transactional"], produced["idempotent"], strict=True
                )
            ],
            "idempotent",
            TRANSACTIONAL_VS_IDEMPOTENT,
        )
    )
    return outcome


def isolation(run: Run) -> Outcome:
    """Fill a topic in transactions, some aborted, then read it to its end in both isolation levels.

    read_committed delivers fewer records (it drops the aborted ones), so the compared figure is
    the time to reach the end of the same log, given as the log's bytes per second.
    """
    outcome = Outcome()
    reads: dict[str, list[dict[str, Any]]] = {level: [] for level in ISOLATION_LEVELS}
    with onceflow_broker(
        run.new_dir("isolation-data"), {"num.partitions": str(THROUGHPUT_PARTITIONS)}, run.work_dir
    ) as broker:
        broker.start()
        log = _produce(
            run,
            broker,
            "isolation",
            TRANSACTION_RECORD_SIZE,
            run.sizes.isolation_log_bytes,
            COMMIT_INTERVAL_MS,
            ABORT_EVERY,
        )
        expected_records = {"read_uncommitted": log["records"], "read_committed": log["records_committed"]}
        for number in range(1, run.sizes.rounds + 1):
            for level in _in_turn(list(ISOLATION_LEVELS), number):
                run.step(f"read to the end, {level} <- {broker.name}")
                figures = _with_rates(
                    run.client(
                        "read-to-end",
                        timeout_s=600,
                        bootstrap=broker.bootstrap,
                        topic="isolation",
                        partitions=THROUGHPUT_PARTITIONS,
                        isolation_level=level,
                    )
                )
                if figures["records"] != expected_records[level]:
                    raise BenchmarkError(
                        f"{level} delivered {figures['records']:,} records,"
                        f" expected {expected_records[level]:,}"
                    )
                figures["log_mb_per_s"] = log["bytes"] / figures["seconds"] / MB
                reads[level].append(figures)
        broker.stop()

    def rounds(key: str, scale: float = 1.0) -> list[tuple[float, float]]:
        """(read_committed, read_uncommitted) of one figure, per round."""
        return [
            (committed[key] / scale, uncommitted[key] / scale)
            for committed, uncommitted in zip(reads["read_committed"], reads["read_uncommitted"], strict=True)
        ]

    outcome.figures = {"log": log, **reads}
    transactions_ended = log["transactions_committed"] + log["transactions_aborted"]
    log_label = f"{log['bytes'] / MB:,.0f} MB, {log['transactions_aborted']}/{transactions_ended} aborted"
    outcome.rows += [
        paired_row(
            f"read_committed to log end ({log_label})",
            "MB/s",
            rounds("log_mb_per_s"),
            "read_uncommitted",
            COMMITTED_VS_UNCOMMITTED,
        ),
        paired_row("read_committed, delivered", "MB/s", rounds("mb_per_s"), "read_uncommitted"),
        paired_row(
            "read_committed, delivered", "k rec/s", rounds("records_per_s", scale=1000), "read_uncommitted"
        ),
    ]
    return outcome


def spark(run: Run) -> Outcome:
    """The onceflow Spark source and sink on one topic of 100-byte records, local[2].

    `spark_job.py` keeps one Spark session up and runs what it is asked, so that each comparison
    runs its two sides alternately, `rounds` times: the streaming query with each delivery
    guarantee and the quixstreams reference in turn (EO ALO quix, then quix ALO EO, ...), then a
    warmed batch read and a read_committed confluent-kafka consumer in turn; then a user's first
    read, each in a fresh session after one small read, and the consumer in turn. Last, every
    exactly-once output must hold one record per input record.
    """
    outcome = Outcome()
    figures = outcome.figures
    records = run.sizes.spark_records
    rounds = run.sizes.rounds
    # Made before the broker starts, so installing quixstreams slows no measured run.
    quix_python, quix_skipped = _quixstreams_venv(run)
    queries: dict[str, list[dict[str, Any]]] = {side: [] for side in (*SPARK_GUARANTEES, "quixstreams")}
    warmed: dict[str, list[dict[str, Any]]] = {"spark": [], "consumer": []}
    first: dict[str, list[dict[str, Any]]] = {"spark": [], "consumer": []}
    with onceflow_broker(
        run.new_dir("spark-data"), {"num.partitions": str(THROUGHPUT_PARTITIONS)}, run.work_dir
    ) as broker:
        broker.start()
        figures["input"] = _produce(run, broker, "spark-in", SPARK_RECORD_SIZE, records * SPARK_RECORD_SIZE)
        with _spark_session(run, broker, "spark-job") as job:
            trigger = run.sizes.spark_max_offsets_per_trigger
            run.step(f"warm both guarantees' query up, maxOffsetsPerTrigger {trigger:,}")
            job.ask({"command": "warm-up"}, SPARK_QUERY_TIMEOUT_S)
            for number in range(1, rounds + 1):
                for side in _in_turn([*SPARK_GUARANTEES, "quixstreams"], number):
                    if side == "quixstreams":
                        if quix_python is not None:
                            queries[side].append(_quixstreams_run(run, broker, quix_python, number))
                        continue
                    run.step(f"Spark query, {side}, spark-in -> spark-out-{side}-{number}")
                    ask = {"command": "stream", "guarantee": side, "name": f"{side}-{number}"}
                    queries[side].append(job.ask(ask, SPARK_QUERY_TIMEOUT_S))
            for number in range(1, rounds + 1):
                for side in _in_turn(["consumer", "spark"], number):
                    if side == "consumer":
                        warmed[side].append(_read_committed(run, broker, "spark-in"))
                        continue
                    warm_ups = SPARK_READ_WARM_UPS if number == 1 else 0
                    run.step(f"Spark batch read of spark-in, values aggregated, after {warm_ups} more reads")
                    warmed[side].append(
                        job.ask({"command": "read", "warm_ups": warm_ups}, SPARK_QUERY_TIMEOUT_S)
                    )
        for number in range(1, rounds + 1):
            for side in _in_turn(["consumer", "spark"], number):
                if side == "consumer":
                    first[side].append(_read_committed(run, broker, "spark-in"))
                    continue
                with _spark_session(run, broker, f"spark-first-read-{number}") as job:
                    run.step("a fresh Spark session: one small read, then the first batch read of spark-in")
                    small = job.ask({"command": "small-read"}, SPARK_QUERY_TIMEOUT_S)
                    read = job.ask({"command": "read", "warm_ups": 0}, SPARK_QUERY_TIMEOUT_S)
                    first[side].append({**read, "small_read": small})
        # Same input, same transform: every exactly-once output holds one record per input record.
        output_topics = [query["output_topic"] for query in queries["exactly-once"]]
        output_topics += [query["output_topic"] for query in queries["quixstreams"]]
        outputs = {topic: _read_committed(run, broker, topic)["records"] for topic in output_topics}
        if set(outputs.values()) != {records}:
            raise BenchmarkError(f"committed output records {outputs}, expected {records} in each")
        broker.stop()
    figures.update(
        {"queries": queries, "exactly_once_outputs": outputs, "warmed_reads": warmed, "first_reads": first}
    )
    figures["quixstreams"] = {"version": QUIXSTREAMS_VERSION, "skipped": quix_skipped}
    outcome.rows += _spark_query_rows(run, queries, quix_skipped)
    outcome.rows += _spark_stage_rows(queries)
    label = f"{records:,} x {SPARK_RECORD_SIZE} B, values aggregated"
    for reads, text, target in (
        (first, f"first in a session after one small read ({label})", SPARK_FIRST_READ_VS_CONSUMER),
        (warmed, f"after {SPARK_READ_WARM_UPS} reads ({label})", SPARK_READ_VS_CONSUMER),
    ):
        pairs = [
            (spark_read["records_per_s"] / 1000, consumer["records_per_s"] / 1000)
            for spark_read, consumer in zip(reads["spark"], reads["consumer"], strict=True)
        ]
        outcome.rows.append(
            paired_row(f"Spark batch read, {text}", "k rec/s", pairs, "confluent-kafka", target)
        )
    return outcome


SPARK_GUARANTEES = ("exactly-once", "at-least-once")
SPARK_QUERY_TIMEOUT_S = 1800.0
SPARK_SESSION_TIMEOUT_S = 300.0
# A batch read is a job of another shape than the queries', and the JVM's JIT went on compiling for
# it (Spark's planner and the scan) over the first reads: in a fresh session of batch reads alone,
# the 2nd to 5th read ran 0.5-0.9 M records/s, later ones 0.7-1.0 M. The warmed reads follow these.
SPARK_READ_WARM_UPS = 4


def _in_turn(sides: list[T], number: int) -> list[T]:
    """The sides of round `number` in order, reversed every other round, so that a trend in the
    machine's load or the JVM's warming up falls on all of them alike."""
    return sides if number % 2 else sides[::-1]


def _spark_session(run: Run, broker: BrokerProcess, name: str) -> ScriptSession:
    session = ScriptSession(
        SPARK_JOB_SCRIPT,
        {
            "bootstrap": broker.bootstrap,
            "topic": "spark-in",
            "partitions": THROUGHPUT_PARTITIONS,
            "records": run.sizes.spark_records,
            "max_offsets_per_trigger": run.sizes.spark_max_offsets_per_trigger,
            "work_dir": run.work_dir / name,
        },
        run.work_dir,
    )
    run.step(f"start a Spark session (local[2]), {name}")
    session.start(SPARK_SESSION_TIMEOUT_S)
    return session


def _spark_query_rows(run: Run, queries: dict[str, list[dict[str, Any]]], quix_skipped: str) -> list[Row]:
    exactly_once, at_least_once = queries["exactly-once"], queries["at-least-once"]
    trigger = run.sizes.spark_max_offsets_per_trigger
    label = f"{run.sizes.spark_records:,} x {SPARK_RECORD_SIZE} B, {trigger:,}/batch"

    def rates(runs: list[dict[str, Any]]) -> list[float]:
        return [query["records_per_s"] / 1000 for query in runs]

    rows = [
        paired_row(
            f"Spark query, exactly-once ({label})",
            "k rec/s",
            list(zip(rates(exactly_once), rates(at_least_once), strict=True)),
            "at-least-once",
            EXACTLY_ONCE_VS_AT_LEAST_ONCE,
        )
    ]
    quix_text = f"Spark query vs quixstreams {QUIXSTREAMS_VERSION}, both exactly-once"
    if queries["quixstreams"]:
        pairs = list(zip(rates(exactly_once), rates(queries["quixstreams"]), strict=True))
        rows.append(paired_row(quix_text, "k rec/s", pairs, "quixstreams", SPARK_VS_QUIXSTREAMS))
    else:
        median = statistics.median(rates(exactly_once))
        rows.append(
            Row(quix_text, "k rec/s", median, None, "quixstreams", SPARK_VS_QUIXSTREAMS, quix_skipped)
        )
    # Each query's first batch is out of the throughput window, so out of the latency figures too.
    for percent in (50, 99):
        pairs = [
            (_percentile(ours["batch_ms"][1:], percent), _percentile(theirs["batch_ms"][1:], percent))
            for ours, theirs in zip(exactly_once, at_least_once, strict=True)
        ]
        rows.append(paired_row(f"Spark micro-batch p{percent}, exactly-once", "ms", pairs, "at-least-once"))
    return rows


# Where a micro-batch's time goes: (row text, where to find the figure in a stream's figures).
# Per batch from the progress's timers; per task from the tasks' own clocks and Spark's status
# store. The exactly-once write task hands its rows to its executor's slot keeper, which produces
# and commits them; `produce` is then the task's sending plus the keeper's producing.
SPARK_BATCH_STAGES = ("offset log", "commit")
SPARK_TASK_STAGES: dict[str, dict[str, list[tuple[str, str]]]] = {
    "fetch": {guarantee: [("read", "fetch_ms")] for guarantee in SPARK_GUARANTEES},
    "Arrow conversion": {guarantee: [("read", "arrow_ms")] for guarantee in SPARK_GUARANTEES},
    "transform (the JVM's CPU: Arrow to rows, the projection, rows to Arrow)": {
        guarantee: [("jvm", "cpu_ms")] for guarantee in SPARK_GUARANTEES
    },
    "produce": {
        "exactly-once": [("write, exactly-once", "to the keeper_ms"), ("keeper write", "produce_ms")],
        "at-least-once": [("write, at-least-once", "produce_ms")],
    },
    "flush and commit": {
        "exactly-once": [("keeper write", "flush_ms"), ("keeper write", "commit_ms")],
        "at-least-once": [("write, at-least-once", "flush_ms")],
    },
    "whole task (the JVM's run time)": {guarantee: [("jvm", "run_ms")] for guarantee in SPARK_GUARANTEES},
}


def _spark_stage_rows(queries: dict[str, list[dict[str, Any]]]) -> list[Row]:
    rows = []
    for stage in SPARK_BATCH_STAGES:
        pairs = [
            (median_stage(ours, stage), median_stage(theirs, stage))
            for ours, theirs in zip(queries["exactly-once"], queries["at-least-once"], strict=True)
        ]
        rows.append(paired_row(f"Spark micro-batch: {stage}, exactly-once", "ms", pairs, "at-least-once"))
    for stage, sources in SPARK_TASK_STAGES.items():
        pairs = [
            (task_stage(ours, sources["exactly-once"]), task_stage(theirs, sources["at-least-once"]))
            for ours, theirs in zip(queries["exactly-once"], queries["at-least-once"], strict=True)
        ]
        rows.append(paired_row(f"Spark task: {stage}, exactly-once", "ms", pairs, "at-least-once"))
    return rows


def median_stage(query: dict[str, Any], stage: str) -> float:
    """A micro-batch stage's median ms over the query's batches but its first."""
    return statistics.median(batch[stage] for batch in query["stage_ms"][1:])


def task_stage(query: dict[str, Any], sources: list[tuple[str, str]]) -> float:
    """The sum of a task stage's medians per task (ms) from its sources: (kind of task, figure)."""
    tasks = {**query["python_tasks"], "jvm": query["jvm_tasks"]}
    return sum(tasks.get(kind, {}).get(figure, 0.0) for kind, figure in sources)


def _quixstreams_venv(run: Run) -> tuple[Path | None, str]:
    """The reference's interpreter, or None and why not: no venv skips its row, not the run."""
    run.step(f"quixstreams {QUIXSTREAMS_VERSION} in {VENV_DIR.name} (made if missing)")
    try:
        return quixstreams_python(run.work_dir / "quixstreams-venv.log"), ""
    except VenvUnavailable as error:
        run.step(f"quixstreams skipped: {error}")
        return None, str(error)


def _quixstreams_run(run: Run, broker: BrokerProcess, python: Path, number: int) -> dict[str, Any]:
    """`quix_payments.py`: the Spark query's transform over the same topic, exactly-once."""
    run.step(f"quixstreams exactly-once, spark-in -> quix-out-{number}")
    figures = run_script(
        [QUIX_SCRIPT],
        {
            "bootstrap": broker.bootstrap,
            "topic": "spark-in",
            "output_topic": f"quix-out-{number}",
            "partitions": THROUGHPUT_PARTITIONS,
            "records": run.sizes.spark_records,
            "consumer_group": f"quix-bench-{number}",
            "state_dir": run.new_dir(f"quix-state-{number}"),
        },
        timeout_s=900,
        log_dir=run.work_dir,
        python=python,
    )
    return {**figures, "output_topic": f"quix-out-{number}"}


def _read_committed(run: Run, broker: BrokerProcess, topic: str) -> dict[str, Any]:
    run.step(f"read {topic} to the end, read_committed, confluent-kafka <- {broker.name}")
    return _with_rates(
        run.client(
            "read-to-end",
            timeout_s=600,
            bootstrap=broker.bootstrap,
            topic=topic,
            partitions=THROUGHPUT_PARTITIONS,
            isolation_level="read_committed",
        )
    )


def _percentile(values: list[float], percent: int) -> float:
    """Nearest-rank percentile: with few batches, p99 is the slowest one."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * percent // 100) - 1)]


def bounds(run: Run) -> Outcome:
    """The cost of checking every request frame's lengths before decoding, on the produce path.

    The same broker with the check and without it (the failpoint that turns it off), alternately,
    each producing the same small records; small records mean more requests per MB, so the
    per-request cost shows most. Besides MB/s, which fsync dominates, the broker's own CPU seconds
    per MB show the cost where it is paid.
    """
    outcome = Outcome()
    modes = {"checked": {}, "unchecked": {"ONCEFLOW_FAILPOINTS": "protocol.no-bounds-check"}}
    produced: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    total_bytes = run.sizes.produce_bytes[100]
    for round_number in range(1, run.sizes.rounds + 1):
        for mode, env in _in_turn(list(modes.items()), round_number):
            data_dir = run.new_dir(f"bounds-{mode}-{round_number}")
            settings = {"num.partitions": str(THROUGHPUT_PARTITIONS)}
            with onceflow_broker(data_dir, settings, run.work_dir, env) as broker:
                broker.start()
                cpu_before = broker.cpu_seconds()
                figures = _produce(run, broker, f"bounds-{mode}", 100, total_bytes)
                cpu = broker.cpu_seconds() - cpu_before
                produced[mode].append(
                    {**figures, "broker_cpu_s": cpu, "mb_per_cpu_s": total_bytes / MB / cpu}
                )
                broker.stop()
    outcome.figures = dict(produced)
    for key, unit in (("mb_per_s", "MB/s"), ("mb_per_cpu_s", "MB per broker CPU s")):
        outcome.rows.append(
            paired_row(
                f"produce 100 B records, bounds check on vs off ({unit})",
                unit,
                [
                    (checked[key], unchecked[key])
                    for checked, unchecked in zip(produced["checked"], produced["unchecked"], strict=True)
                ],
                "without the check",
                BOUNDS_CHECK_COST,
            )
        )
    return outcome


def replication(run: Run) -> Outcome:
    """One broker and a 3-broker cluster (ZooKeeper, the session timeout `onceflow cluster run`
    sets) with replication factor 3, both up at once and loaded alternately (the idle side costs
    next to nothing), so that a change in the machine's load falls on both: produce throughput,
    then produce-to-consume latency, each a few times per side, acks=all, same client and bytes;
    the rows compare medians. Then on the cluster, SIGKILL a partition's leader under a steady
    producer and time until a new leader acknowledges, a few times over.
    """
    outcome = Outcome()
    figures = outcome.figures
    settings = {"num.partitions": str(THROUGHPUT_PARTITIONS)}
    total_bytes = run.sizes.produce_bytes[1000]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        side: {"produce": [], "latency": []} for side in ("single", "cluster")
    }
    unreplicated_latency: list[dict[str, Any]] = []
    single_dir = run.new_dir("replication-single-data")
    with (
        onceflow_broker(single_dir, settings, run.work_dir) as single,
        OnceflowCluster(
            CLUSTER_SIZE, run.new_dir("replication-cluster-data"), settings, run.work_dir
        ) as cluster,
    ):
        single.start()
        run.step(
            f"start ZooKeeper and {CLUSTER_SIZE} brokers, zookeeper.session.timeout.ms={SESSION_TIMEOUT_MS}"
        )
        cluster.start()
        for topic in ("replication-latency", "replication-failover"):
            cluster.create_topic(topic, THROUGHPUT_PARTITIONS)
        # The same load on the same brokers without followers: what sharing the cores with three
        # brokers costs a record before replication adds anything.
        cluster.create_topic(UNREPLICATED_LATENCY_TOPIC, THROUGHPUT_PARTITIONS, replication_factor=1)
        sides: list[tuple[str, Reachable, list[BrokerProcess], Path]] = [
            ("single", single, [single], single_dir),
            ("cluster", cluster, list(cluster.brokers.values()), cluster.data_dir),
        ]
        # Each run starts with no dirty page left to write back: the cluster's produce runs
        # leave gigabytes of it, whose writeback would slow the fsyncs of the runs after them.
        # And each writes a topic of its own, deleted after it: on this VM a page the kernel
        # has not used since boot costs ten times the CPU to write into (0.2 against 2.3 ms a
        # MB, the host's fault), and which side's round crossed into such memory decided the
        # CPU ratio more than the brokers did (2.13 to 4.33 x in one run).
        for number in range(1, run.sizes.rounds + 1):
            for side, target, brokers, data_dir in _in_turn(sides, number):
                topic = f"replication-produce-{number}"
                if side == "cluster":
                    cluster.create_topic(topic, THROUGHPUT_PARTITIONS)
                os.sync()
                runs[side]["produce"].append(_produce_counting_cpu(run, target, brokers, topic, total_bytes))
                delete_topic(target.bootstrap, topic, data_dir)
        for number in range(1, run.sizes.rounds + 1):
            for side, target, _, _ in _in_turn(sides, number):
                os.sync()
                runs[side]["latency"].append(_steady_latency(run, target, "replication-latency"))
            os.sync()
            unreplicated_latency.append(_steady_latency(run, cluster, UNREPLICATED_LATENCY_TOPIC))
        single.stop()
        figures["failovers"] = [
            _failover(run, cluster, "replication-failover") for _ in range(run.sizes.rounds)
        ]
        figures["coordinator_failovers"] = [
            _coordinator_failover(run, cluster, "replication-failover", number)
            for number in range(run.sizes.rounds)
        ]
    for side, side_runs in runs.items():
        figures[side] = side_runs
    figures["cluster_rf1"] = {"latency": unreplicated_latency}
    failover_s = statistics.median(kill["failover_s"] for kill in figures["failovers"])
    figures["failover_median_s"] = failover_s
    coordinator_failover_s = statistics.median(
        kill["failover_s"] for kill in figures["coordinator_failovers"]
    )
    figures["coordinator_failover_median_s"] = coordinator_failover_s
    coordinator_kills = " / ".join(f"{kill['failover_s']:.2f}" for kill in figures["coordinator_failovers"])
    figures["session_timeout_ms"] = SESSION_TIMEOUT_MS
    single, cluster_runs = runs["single"], runs["cluster"]
    kills = " / ".join(f"{kill['failover_s']:.2f}" for kill in figures["failovers"])
    rounds = f"{run.sizes.rounds} rounds"

    def pairs(
        side: list[dict[str, Any]], reference: list[dict[str, Any]], key: str
    ) -> list[tuple[float, float]]:
        return [(ours[key], theirs[key]) for ours, theirs in zip(side, reference, strict=True)]

    outcome.rows += [
        paired_row(
            f"produce 1 KB, RF {CLUSTER_SIZE} on {CLUSTER_SIZE} brokers, acks=all ({rounds})",
            "MB/s",
            pairs(cluster_runs["produce"], single["produce"], "mb_per_s"),
            "one broker",
            REPLICATED_VS_SINGLE_PRODUCE,
        ),
        paired_row(
            f"brokers' CPU per acknowledged MB, RF {CLUSTER_SIZE} on {CLUSTER_SIZE} brokers ({rounds})",
            "CPU ms/MB",
            pairs(cluster_runs["produce"], single["produce"], "cpu_ms_per_mb"),
            "one broker",
            REPLICATED_VS_SINGLE_CPU,
        ),
        paired_row(
            f"of which system time (the kernel's), RF {CLUSTER_SIZE} ({rounds})",
            "CPU ms/MB",
            pairs(cluster_runs["produce"], single["produce"], "system_ms_per_mb"),
            "one broker",
        ),
        Row(
            f"failover, leader SIGKILLed to new leader's ack (median of {kills} s)",
            "s",
            failover_s,
            SESSION_TIMEOUT_MS / 1000,
            "session timeout",
            FAILOVER,
        ),
        Row(
            f"coordinator failover, its broker SIGKILLed to the next commit ({coordinator_kills} s)",
            "s",
            coordinator_failover_s,
            failover_s,
            "leader failover",
            COORDINATOR_FAILOVER,
        ),
        paired_row(
            f"latency p50 at 10 MB/s, RF {CLUSTER_SIZE} ({rounds})",
            "ms",
            pairs(cluster_runs["latency"], single["latency"], "p50_ms"),
            "one broker",
        ),
        paired_row(
            f"latency p99 at 10 MB/s, RF {CLUSTER_SIZE} ({rounds})",
            "ms",
            pairs(cluster_runs["latency"], single["latency"], "p99_ms"),
            "one broker",
            REPLICATED_VS_SINGLE_LATENCY,
        ),
        paired_row(
            f"latency p99 at 10 MB/s, RF 1 on the same {CLUSTER_SIZE} brokers ({rounds})",
            "ms",
            pairs(unreplicated_latency, single["latency"], "p99_ms"),
            "one broker",
        ),
    ]
    return outcome


def _produce_counting_cpu(
    run: Run, target: Reachable, brokers: list[BrokerProcess], topic: str, total_bytes: int
) -> dict[str, Any]:
    """`_produce` of 1 KB records, plus the CPU seconds its brokers spent meanwhile: on 2 cores,
    whether a cluster's brokers (each appending every byte) ran out of CPU. Their system time
    apart: the kernel's part, mostly each byte's copies through sockets and the page cache."""
    before = [broker.cpu_times() for broker in brokers]
    figures = _produce(run, target, topic, 1000, total_bytes)
    after = [broker.cpu_times() for broker in brokers]
    spans = list(zip(after, before, strict=True))
    cpu = [sum(now) - sum(then) for now, then in spans]
    system = [now[1] - then[1] for now, then in spans]
    megabytes = figures["bytes"] / MB
    return {
        **figures,
        "broker_cpu_s": cpu,
        "broker_system_s": system,
        "broker_cores_busy": sum(cpu) / figures["seconds"],
        "cpu_ms_per_mb": sum(cpu) * 1000 / megabytes,
        "system_ms_per_mb": sum(system) * 1000 / megabytes,
    }


def _failover(run: Run, cluster: OnceflowCluster, topic: str) -> dict[str, Any]:
    """SIGKILL the leader of one partition (the client kills it, under its steady producer), then
    start that broker again with the same id, port and data dir, for the next kill."""
    killed_id = cluster.wait_in_sync(topic, FAILOVER_PARTITION).leader
    leader = cluster.brokers[killed_id]
    run.step(
        f"steady producer -> {topic}/{FAILOVER_PARTITION}, SIGKILL its leader ({leader.name})"
        f" after {FAILOVER_WARMUP_SECONDS:.0f} s"
    )
    kill = run.client(
        "failover",
        timeout_s=FAILOVER_WARMUP_SECONDS + 120,
        bootstrap=cluster.bootstrap,
        topic=topic,
        partitions=THROUGHPUT_PARTITIONS,
        partition=FAILOVER_PARTITION,
        kill_pid=leader.pid,
        interval_ms=FAILOVER_INTERVAL_MS,
        warmup_seconds=FAILOVER_WARMUP_SECONDS,
    )
    leader.kill()  # reaps the process the client killed
    new_id = cluster.partition(topic, FAILOVER_PARTITION).leader
    if new_id == killed_id:
        raise BenchmarkError(
            f"{topic}/{FAILOVER_PARTITION} still names the killed broker {killed_id} as leader"
        )
    run.step(f"{kill['failover_s']:.2f} s to the first ack from broker {new_id}; restart {leader.name}")
    leader.start()
    return {**kill, "killed_broker": killed_id, "new_leader": new_id}


def security(run: Run) -> Outcome:
    """Produce 1 KB records to a broker over TLS and to one over plaintext, both up at once and
    loaded alternately, a few times each (the rows compare medians); then the time one
    connection takes to log in with SASL/SCRAM-SHA-256 at 4,096 iterations, beside PLAIN's, one
    connection after another to a SASL_PLAINTEXT listener (so the login alone is timed)."""
    from onceflow.security.certificates import make_certificates

    outcome = Outcome()
    ca, keystore = make_certificates(run.new_dir("security-certificates"))
    partitions = {"num.partitions": str(THROUGHPUT_PARTITIONS)}
    tls_settings = {
        **partitions,
        "listeners": "SSL://127.0.0.1:0",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca),
    }
    user, password = BENCH_ADMIN
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{user}" password="{password}" user_{user}="{password}";'
    )
    sasl_settings = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
    }
    tls_client = {"security.protocol": "SSL", "ssl.ca.location": str(ca)}
    runs: dict[str, list[dict[str, Any]]] = {"tls": [], "plaintext": []}
    total_bytes = run.sizes.produce_bytes[1000]
    with (
        onceflow_broker(run.new_dir("security-plaintext-data"), partitions, run.work_dir) as plaintext,
        _listener_broker("TLS", run.new_dir("security-tls-data"), tls_settings, run) as tls,
        _listener_broker("SASL", run.new_dir("security-sasl-data"), sasl_settings, run) as sasl,
    ):
        for broker in (plaintext, tls, sasl):
            broker.start()
        for _ in range(run.sizes.rounds):
            for side, broker, client in (("tls", tls, tls_client), ("plaintext", plaintext, None)):
                os.sync()
                runs[side].append(
                    _produce(run, broker, f"security-{side}", 1000, total_bytes, client_config=client)
                )
        _add_scram_user(sasl.bootstrap, user, password)
        logins = {
            mechanism: run.client(
                "connect",
                timeout_s=300,
                bootstrap=sasl.bootstrap,
                connections=SCRAM_CONNECTIONS,
                mechanism=mechanism,
                username=user,
                password=password,
            )
            for mechanism in ("SCRAM-SHA-256", "PLAIN")
        }
        for broker in (plaintext, tls, sasl):
            broker.stop()
    medians = {
        side: statistics.median(figures["mb_per_s"] for figures in side_runs)
        for side, side_runs in runs.items()
    }
    outcome.figures = {**runs, "median_mb_per_s": medians, "logins": logins}
    outcome.rows += [
        Row(
            f"produce 1 KB over TLS, acks=all (median of {run.sizes.rounds} per side)",
            "MB/s",
            medians["tls"],
            medians["plaintext"],
            "plaintext",
            TLS_VS_PLAINTEXT,
        ),
        Row(
            f"SASL/SCRAM-SHA-256 login, {SCRAM_ITERATIONS:,} iterations"
            f" (median of {SCRAM_CONNECTIONS} connections)",
            "ms",
            logins["SCRAM-SHA-256"]["median_ms"],
            logins["PLAIN"]["median_ms"],
            "PLAIN login",
            SCRAM_LOGIN,
        ),
    ]
    return outcome


def _listener_broker(name: str, data_dir: Path, settings: dict[str, str], run: Run) -> BrokerProcess:
    """A onceflow broker whose `listeners` setting names its one listener."""
    argv = [sys.executable, "-m", "onceflow.cli", "broker", "--data-dir", str(data_dir)]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return BrokerProcess(
        f"onceflow broker ({name})", argv, run.work_dir / f"onceflow-broker-{name.lower()}.log"
    )


def _add_scram_user(bootstrap: str, user: str, password: str) -> None:
    """The SCRAM credential of `user`, added by the same user logged in with PLAIN."""
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": password,
        }
    )
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, SCRAM_ITERATIONS), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=60)


def _coordinator_failover(run: Run, cluster: OnceflowCluster, topic: str, number: int) -> dict[str, Any]:
    """SIGKILL the broker that coordinates a transactional id (the leader of its partition of
    `__transaction_state`, 50 partitions with 3 replicas), under a producer that commits a
    transaction every 20 ms, and time until a transaction begun after the kill commits; then
    start that broker again."""
    transactional_id = f"bench-coordinator-{number}"
    # The id's first session: __transaction_state exists from here, and the id in it.
    Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": transactional_id}
    ).init_transactions(60)
    # Every replica in sync, as before each leader failover: with the ISR at min.insync.replicas,
    # the kill would leave the new leader refusing writes until the restarted broker caught up.
    view = read_cluster(cluster.zookeeper.connect_string, 10)
    for partition in range(view.partition_count(TRANSACTION_LOG)):
        cluster.wait_in_sync(TRANSACTION_LOG, partition)
    coordinator_id = view.coordinator(TRANSACTION_LOG, transactional_id)
    if coordinator_id not in cluster.brokers:
        raise BenchmarkError(f"no live coordinator of {transactional_id!r}")
    coordinator = cluster.brokers[coordinator_id]
    run.step(
        f"a transaction every {COORDINATOR_FAILOVER_INTERVAL_MS} ms -> {topic}, SIGKILL the coordinator"
        f" ({coordinator.name}) after {FAILOVER_WARMUP_SECONDS:.0f} s"
    )
    kill = run.client(
        "coordinator-failover",
        timeout_s=FAILOVER_WARMUP_SECONDS + 120,
        bootstrap=cluster.bootstrap,
        topic=topic,
        partitions=THROUGHPUT_PARTITIONS,
        transactional_id=transactional_id,
        kill_pid=coordinator.pid,
        interval_ms=COORDINATOR_FAILOVER_INTERVAL_MS,
        warmup_seconds=FAILOVER_WARMUP_SECONDS,
    )
    coordinator.kill()  # reaps the process the client killed
    run.step(f"{kill['failover_s']:.2f} s to the next commit; restart {coordinator.name}")
    coordinator.start()
    try:
        wait_registered(cluster.zookeeper.connect_string, cluster.size)
    except LaunchError as error:
        raise BenchmarkError(str(error)) from None
    return {**kill, "killed_broker": coordinator_id}


SCENARIOS: dict[str, Callable[[Run], Outcome]] = {
    "throughput": throughput,
    "latency": latency,
    "restart": restart,
    "transactions": transactions,
    "isolation": isolation,
    "spark": spark,
    "bounds": bounds,
    "replication": replication,
    "security": security,
}


def _with_rates(figures: dict[str, Any]) -> dict[str, Any]:
    return {
        **figures,
        "mb_per_s": figures["bytes"] / figures["seconds"] / MB,
        "records_per_s": figures["records"] / figures["seconds"],
    }


def _record_label(record_size: int) -> str:
    return "1 KB" if record_size == 1000 else f"{record_size} B"


def _checkpointed_records(data_dir: Path) -> int:
    """The sum of the recovery points: how much of the log a restart may trust without reading it."""
    checkpoint = data_dir / "recovery-point-offset-checkpoint"
    if not checkpoint.exists():
        return 0
    # Kafka's format: a version line, a count line, then "topic partition offset" lines.
    entries = [line.split() for line in checkpoint.read_text().splitlines()[2:]]
    return sum(int(entry[-1]) for entry in entries if len(entry) == 3)


def _bytes_under(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
