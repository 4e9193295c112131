"""Broker metrics in Prometheus form, named after Kafka's JMX metrics (docs/metrics.md).

Hot paths only bump counters: once per request, once per partition of a produce or
fetch, once per fsync. Everything that needs a scan (partition counts, LSO lag, open
transactions, consumer-group lag) is computed when Prometheus scrapes, by a collector.

Each broker has its own `CollectorRegistry`, so several brokers in one process do not
collide. A broker started without metrics gets `Metrics`, whose hooks do nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kio.schema.errors import ErrorCode
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.transaction import TransactionCoordinator
from onceflow.log.log import PartitionLog
from onceflow.log.manager import LogManager

# The coordinators this broker runs now (one per internal partition it leads).
Coordinators = Callable[[], tuple[Iterable[TransactionCoordinator], Iterable[GroupCoordinator]]]
HighWatermark = Callable[[str, int, PartitionLog], int]

# Request latency: from sub-millisecond metadata answers to long polls and slow fsyncs.
REQUEST_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Where a produce-to-consume round trip spends its time, stage by stage (benchmarks/README.md):
STAGE_DECODE_TO_APPEND = "decode_to_append"  # a Produce request read, decoded and appended
STAGE_FSYNC_WAIT = "fsync_wait"  # appended -> fsynced (acks=all)
STAGE_FSYNC_TO_ANSWER = "fsync_to_answer"  # fsynced -> the answer handed to the socket
STAGE_HW_TO_FETCH_WAKEUP = "hw_to_fetch_wakeup"  # the high watermark moved -> a waiting fetch runs
STAGES = (STAGE_DECODE_TO_APPEND, STAGE_FSYNC_WAIT, STAGE_FSYNC_TO_ANSWER, STAGE_HW_TO_FETCH_WAKEUP)
STAGE_SECONDS_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
)  # fmt: skip
# How a partition's flush ran (`Metrics.flushed`).
FLUSH_BY_KERNEL = "linux_aio"
FLUSH_ON_THREAD = "thread"
FLUSH_HOWS = (FLUSH_BY_KERNEL, FLUSH_ON_THREAD)
FLUSH_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class Metrics:
    """The hooks the server and the APIs call. This one records nothing (no `--metrics`)."""

    registry: CollectorRegistry | None = None

    def request_finished(self, api_key: int, request: str, started: float, response: Any) -> None:
        """A request of `request` (Kafka's name) was answered; `started` is its perf_counter()."""

    def stored(self, topic: str, size: int, records: int) -> None:
        """A batch of `records` records, `size` bytes, was appended to `topic`."""

    def sent(self, topic: str, size: int) -> None:
        """A fetch answer carries `size` bytes of `topic`."""

    def flushed(self, seconds: float, how: str) -> None:
        """One partition's flush took `seconds`; `how` it ran: `linux_aio` or `thread`."""

    def stage(self, stage: str, seconds: float) -> None:
        """One request spent `seconds` in `stage` (one of `STAGES`)."""


class PrometheusMetrics(Metrics):
    def __init__(self, logs: LogManager, coordinators: Coordinators, high_watermark: HighWatermark) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "kafka_network_requestmetrics_requests",
            "Requests answered, per API (RequestsPerSec).",
            ["request", "api_key"],
            registry=self.registry,
        )
        self._errors = Counter(
            "kafka_network_requestmetrics_errors",
            "Error codes in answers, per API and code; NONE counts the successes (ErrorsPerSec).",
            ["request", "api_key", "error"],
            registry=self.registry,
        )
        self._total_time = Histogram(
            "kafka_network_requestmetrics_total_time_seconds",
            "From a request's arrival to its answer, waits for fsync included (TotalTimeMs).",
            ["request", "api_key"],
            buckets=REQUEST_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self._bytes_in = Counter(
            "kafka_server_brokertopicmetrics_bytes_in",
            "Bytes of record batches appended, per topic (BytesInPerSec).",
            ["topic"],
            registry=self.registry,
        )
        self._messages_in = Counter(
            "kafka_server_brokertopicmetrics_messages_in",
            "Records appended, per topic (MessagesInPerSec).",
            ["topic"],
            registry=self.registry,
        )
        self._bytes_out = Counter(
            "kafka_server_brokertopicmetrics_bytes_out",
            "Bytes of record batches sent to fetchers, per topic (BytesOutPerSec).",
            ["topic"],
            registry=self.registry,
        )
        self._flush_time = Histogram(
            "kafka_log_logflushstats_log_flush_seconds",
            "Time of one partition's fsync (LogFlushRateAndTimeMs).",
            buckets=FLUSH_SECONDS_BUCKETS,
            registry=self.registry,
        )
        flushes = Counter(
            "onceflow_log_flushes",
            "Partition flushes, by how they ran: linux_aio (one fdatasync the event loop hands to "
            "the kernel) or thread.",
            ["how"],
            registry=self.registry,
        )
        self._flushes_by_how = {how: flushes.labels(how) for how in FLUSH_HOWS}
        stage_time = Histogram(
            "onceflow_stage_seconds",
            "Time per stage of a produce-to-consume round trip (decode_to_append, fsync_wait, "
            "fsync_to_answer, hw_to_fetch_wakeup).",
            ["stage"],
            buckets=STAGE_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self._stage_children = {stage: stage_time.labels(stage) for stage in STAGES}
        # labels() costs more than the increment it serves: resolve each child once.
        self._request_children: dict[int, tuple[Any, Any]] = {}
        self._error_children: dict[tuple[int, ErrorCode], Any] = {}
        self._topic_in: dict[str, tuple[Any, Any]] = {}
        self._topic_out: dict[str, Any] = {}
        self.registry.register(_StateCollector(logs, coordinators, high_watermark))

    def request_finished(self, api_key: int, request: str, started: float, response: Any) -> None:
        children = self._request_children.get(api_key)
        if children is None:
            labels = (request, str(api_key))
            children = self._request_children[api_key] = (
                self._requests.labels(*labels),
                self._total_time.labels(*labels),
            )
        requests, total_time = children
        requests.inc()
        total_time.observe(time.perf_counter() - started)
        if response is not None:
            # Mostly one code (NONE) many times over: one increment per distinct code.
            for code, count in collections.Counter(error_codes(response)).items():
                counter = self._error_children.get((api_key, code))
                if counter is None:
                    counter = self._error_children[(api_key, code)] = self._errors.labels(
                        request, str(api_key), code.name.upper()
                    )
                counter.inc(count)

    def stored(self, topic: str, size: int, records: int) -> None:
        children = self._topic_in.get(topic)
        if children is None:
            children = self._topic_in[topic] = (self._bytes_in.labels(topic), self._messages_in.labels(topic))
        children[0].inc(size)
        children[1].inc(records)

    def sent(self, topic: str, size: int) -> None:
        counter = self._topic_out.get(topic)
        if counter is None:
            counter = self._topic_out[topic] = self._bytes_out.labels(topic)
        counter.inc(size)

    def flushed(self, seconds: float, how: str) -> None:
        self._flush_time.observe(seconds)
        self._flushes_by_how[how].inc()

    def stage(self, stage: str, seconds: float) -> None:
        self._stage_children[stage].observe(seconds)


class _StateCollector(Collector):
    """Gauges read from the broker's state at scrape time (on the event loop, see server.py)."""

    def __init__(self, logs: LogManager, coordinators: Coordinators, high_watermark: HighWatermark) -> None:
        self._logs = logs
        self._coordinators = coordinators
        self._high_watermark = high_watermark

    def collect(self) -> Iterator[Metric]:
        partition_count = GaugeMetricFamily(
            "kafka_server_replicamanager_partition_count", "Partitions on this broker (PartitionCount)."
        )
        under_replicated = GaugeMetricFamily(
            "kafka_server_replicamanager_under_replicated_partitions",
            "Always 0: a single broker is every partition's only replica (UnderReplicatedPartitions).",
        )
        lso_lag = GaugeMetricFamily(
            "kafka_cluster_partition_last_stable_offset_lag",
            "High watermark minus last stable offset: what open transactions hold back "
            "from read_committed consumers (LastStableOffsetLag).",
            labels=["topic", "partition"],
        )
        high_watermarks: dict[tuple[str, int], int] = {}
        for topic, partition, log in self._logs.partitions():
            hw = self._high_watermark(topic, partition, log)
            high_watermarks[(topic, partition)] = hw
            lso_lag.add_metric([topic, str(partition)], hw - log.last_stable_offset(hw))
        partition_count.add_metric([], len(high_watermarks))
        under_replicated.add_metric([], 0)
        yield partition_count
        yield under_replicated
        yield lso_lag
        transactions, groups = self._coordinators()
        yield from self._transaction_metrics(transactions)
        yield from self._group_metrics(groups, high_watermarks)

    def _transaction_metrics(self, coordinators: Iterable[TransactionCoordinator]) -> Iterator[Metric]:
        now_ms = int(time.time() * 1000)
        open_starts = [
            metadata.start_ms
            for coordinator in coordinators
            for metadata in coordinator.transactions.values()
            if not metadata.state.is_complete
        ]
        count = GaugeMetricFamily(
            "onceflow_transactions_open", "Transactions begun and not yet completed (Ongoing or Prepare*)."
        )
        count.add_metric([], len(open_starts))
        oldest = GaugeMetricFamily(
            "onceflow_transactions_oldest_open_age_seconds",
            "Age of the oldest open transaction; 0 when none is open.",
        )
        oldest.add_metric([], max(0, now_ms - min(open_starts)) / 1000 if open_starts else 0)
        yield count
        yield oldest

    def _group_metrics(
        self, coordinators: Iterable[GroupCoordinator], high_watermarks: dict[tuple[str, int], int]
    ) -> Iterator[Metric]:
        labels = ["consumergroup", "topic", "partition"]
        committed = GaugeMetricFamily(
            "kafka_consumergroup_current_offset", "A group's committed offset, per partition.", labels=labels
        )
        lag = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "High watermark minus a group's committed offset, per partition.",
            labels=labels,
        )
        for coordinator, listing in ((c, listing) for c in coordinators for listing in c.list_groups()):
            for fetched in coordinator.fetch_offsets(listing.group_id, None, require_stable=False):
                topic, partition = fetched.partition
                hw = high_watermarks.get((topic, partition))
                if fetched.offset is None or hw is None:
                    continue  # nothing committed, or a partition deleted since
                values = [listing.group_id, topic, str(partition)]
                committed.add_metric(values, fetched.offset.offset)
                lag.add_metric(values, hw - fetched.offset.offset)
        yield committed
        yield lag


def error_codes(response: Any) -> list[ErrorCode]:
    """Every error code in a kio response entity, nested ones included (Kafka's errorCounts)."""
    codes: list[ErrorCode] = []
    walk = _error_code_walker(type(response))
    if walk is not None:
        walk(response, codes)
    return codes


_Walker = Callable[[Any, list[ErrorCode]], None]
_walkers: dict[type[Any], _Walker | None] = {}


def _error_code_walker(entity_class: type[Any]) -> _Walker | None:
    """A function that collects the error codes of an instance of `entity_class`, or None when
    it has none. Built once per class from the field types (kio's schemas are trees), so that a
    response is walked only along the fields that can hold an error code."""
    if entity_class in _walkers:
        return _walkers[entity_class]
    hints = typing.get_type_hints(entity_class)
    codes_at: list[str] = []
    entities_at: list[tuple[str, _Walker]] = []
    entity_tuples_at: list[tuple[str, _Walker]] = []
    for field in dataclasses.fields(entity_class):
        annotation = hints[field.name]
        if annotation is ErrorCode:
            codes_at.append(field.name)
            continue
        is_tuple = typing.get_origin(annotation) is tuple
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)] or [annotation]
        item_class = options[0]
        if not (isinstance(item_class, type) and dataclasses.is_dataclass(item_class)):
            continue
        item_walker = _error_code_walker(item_class)
        if item_walker is not None:
            (entity_tuples_at if is_tuple else entities_at).append((field.name, item_walker))

    def walk(entity: Any, codes: list[ErrorCode]) -> None:
        for name in codes_at:
            codes.append(getattr(entity, name))
        for name, walk_entity in entities_at:
            value = getattr(entity, name)
            if value is not None:
                walk_entity(value, codes)
        for name, walk_item in entity_tuples_at:
            for item in getattr(entity, name):
                walk_item(item, codes)

    walker = walk if codes_at or entities_at or entity_tuples_at else None
    _walkers[entity_class] = walker
    return walker
