"""Broker metrics in Prometheus form, named after Kafka's JMX metrics (docs/metrics.md).

Hot paths only bump counters: once per request, once per partition of a produce or
fetch, once per fsync, once per ISR change. Everything that needs a scan (partition counts,
replica health, offsets, open transactions, consumer-group lag) is computed when Prometheus
scrapes, by a collector that reads the broker through `BrokerState`: its replica state comes
from one accessor, `replica_states()`, so the high watermark it exports is the ISR's.

Each broker has its own `CollectorRegistry`, so several brokers in one process do not
collide. A broker started without metrics gets `Metrics`, whose hooks do nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.group_metadata import GroupState
from onceflow.coordinator.transaction import TransactionCoordinator
from onceflow.log.log import PartitionLog

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


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaState:
    """One partition this broker holds, as its metrics read it."""

    topic: str
    partition: int
    log: PartitionLog
    leader: bool  # this broker leads it (a single broker leads every partition)
    high_watermark: int  # the ISR's on a leader; on a follower, the last its leader sent
    replicas: int  # assigned
    in_sync: int
    min_insync: int  # min.insync.replicas in effect


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerState:
    active: bool  # this broker is the controller (a single broker is its own)
    offline_partitions: int  # without a live leader, as the active controller counts them; else 0


class BrokerState(Protocol):
    """What the collector reads of the broker when Prometheus scrapes."""

    def coordinators(self) -> tuple[Iterable[TransactionCoordinator], Iterable[GroupCoordinator]]:
        """The coordinators this broker runs now (one per internal partition it leads)."""

    @property
    def coordinator_load_seconds(self) -> Mapping[str, float]: ...

    def replica_states(self) -> Sequence[ReplicaState]: ...

    def controller_state(self) -> ControllerState: ...


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

    def storage_error(self, operation: str) -> None:
        """A read or write of the logs failed with an I/O error during `operation` (an append,
        a background task); its answer, if any, was KAFKA_STORAGE_ERROR."""

    def isr_changed(self, shrunk: bool) -> None:
        """This broker, as a partition's leader, shrank (or expanded) its ISR."""

    def authentication(self, listener: str, succeeded: bool) -> None:
        """A client on `listener` authenticated (SASL), or failed to (SASL or the TLS handshake)."""


class PrometheusMetrics(Metrics):
    def __init__(self, broker: BrokerState) -> None:
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
        self._storage_errors = Counter(
            "onceflow_storage_errors",
            "I/O errors of the logs, by what failed: an append (answered KAFKA_STORAGE_ERROR) or a "
            "background task (flushing, checkpoint, retention, snapshots, cleaning), which retries.",
            ["operation"],
            registry=self.registry,
        )
        self._isr_shrinks = Counter(
            "kafka_server_replicamanager_isr_shrinks",
            "ISR shrinks by this broker as leader: followers dropped for lagging (IsrShrinksPerSec).",
            registry=self.registry,
        )
        self._isr_expands = Counter(
            "kafka_server_replicamanager_isr_expands",
            "ISR expansions by this broker as leader: followers back in sync (IsrExpandsPerSec).",
            registry=self.registry,
        )
        self._authentications = {
            succeeded: Counter(
                "kafka_server_socket_server_metrics_"
                f"{'successful' if succeeded else 'failed'}_authentication",
                f"Connections that {'authenticated' if succeeded else 'failed to authenticate'}, per "
                f"listener ({'successful' if succeeded else 'failed'}-authentication-total).",
                ["listener"],
                registry=self.registry,
            )
            for succeeded in (True, False)
        }
        # labels() costs more than the increment it serves: resolve each child once.
        self._request_children: dict[int, tuple[Any, Any]] = {}
        self._error_children: dict[tuple[int, ErrorCode], Any] = {}
        self._topic_in: dict[str, tuple[Any, Any]] = {}
        self._topic_out: dict[str, Any] = {}
        self.registry.register(_StateCollector(broker))

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

    def storage_error(self, operation: str) -> None:
        self._storage_errors.labels(operation).inc()

    def isr_changed(self, shrunk: bool) -> None:
        (self._isr_shrinks if shrunk else self._isr_expands).inc()

    def authentication(self, listener: str, succeeded: bool) -> None:
        self._authentications[succeeded].labels(listener).inc()


class _StateCollector(Collector):
    """Gauges read from the broker's state at scrape time (on the event loop, see server.py)."""

    def __init__(self, broker: BrokerState) -> None:
        self._broker = broker

    def collect(self) -> Iterator[Metric]:
        replicas = self._broker.replica_states()
        yield from self._replica_manager(replicas)
        yield from self._controller()
        yield from self._partitions(replicas)
        transactions, groups = self._broker.coordinators()
        yield from self._transaction_metrics(transactions)
        yield from self._group_metrics(groups, {(r.topic, r.partition): r.high_watermark for r in replicas})
        load = GaugeMetricFamily(
            "onceflow_coordinator_load_seconds",
            "The longest time a partition of each coordinator's internal topic took to load, from "
            "its election to serving (group- and transaction-coordinator-metrics partition-load-time-max).",
            labels=["coordinator"],
        )
        for coordinator, seconds in sorted(self._broker.coordinator_load_seconds.items()):
            load.add_metric([coordinator], seconds)
        yield load
        yield self._corrupt_ranges(replicas)

    def _corrupt_ranges(self, replicas: Sequence[ReplicaState]) -> Metric:
        corrupt = GaugeMetricFamily(
            "onceflow_log_corrupt_ranges",
            "Stretches of a partition's segments that hold no readable batch, found by recovery and "
            "kept (reads there answer CORRUPT_MESSAGE; `onceflow log check` lists them).",
            labels=["topic", "partition"],
        )
        for replica in replicas:
            if found := replica.log.corrupt_ranges:
                corrupt.add_metric([replica.topic, str(replica.partition)], len(found))
        return corrupt

    def _replica_manager(self, replicas: Sequence[ReplicaState]) -> Iterator[Metric]:
        """Kafka's ReplicaManager gauges, counted over the partitions this broker leads."""
        led = [replica for replica in replicas if replica.leader]
        for name, help_text, value in (
            (
                "partition_count",
                "Partitions on this broker, led or followed (PartitionCount).",
                len(replicas),
            ),
            ("leader_count", "Partitions this broker leads (LeaderCount).", len(led)),
            (
                "under_replicated_partitions",
                "Led partitions with fewer replicas in sync than assigned (UnderReplicatedPartitions).",
                sum(replica.in_sync < replica.replicas for replica in led),
            ),
            (
                "under_min_isr_partition_count",
                "Led partitions whose ISR is smaller than min.insync.replicas (UnderMinIsrPartitionCount).",
                sum(replica.in_sync < replica.min_insync for replica in led),
            ),
        ):
            gauge = GaugeMetricFamily(f"kafka_server_replicamanager_{name}", help_text)
            gauge.add_metric([], value)
            yield gauge

    def _controller(self) -> Iterator[Metric]:
        state = self._broker.controller_state()
        active = GaugeMetricFamily(
            "kafka_controller_kafkacontroller_active_controller_count",
            "1 on the active controller, 0 elsewhere (ActiveControllerCount).",
        )
        active.add_metric([], 1 if state.active else 0)
        offline = GaugeMetricFamily(
            "kafka_controller_kafkacontroller_offline_partitions_count",
            "Partitions without a live leader, on the active controller; 0 elsewhere "
            "(OfflinePartitionsCount).",
        )
        offline.add_metric([], state.offline_partitions)
        yield active
        yield offline

    def _partitions(self, replicas: Sequence[ReplicaState]) -> Iterator[Metric]:
        labels = ["topic", "partition"]

        def gauge(name: str, help_text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_text, labels=labels)

        # Every replica's log (Kafka's Log metrics, on followers too).
        log_end = gauge("kafka_log_log_log_end_offset", "The offset after the last record (LogEndOffset).")
        log_start = gauge("kafka_log_log_log_start_offset", "The first offset in the log (LogStartOffset).")
        size = gauge("kafka_log_log_size", "Bytes of the log's segments (Size).")
        # The leader's view of each partition it leads: one series per partition in a cluster.
        high_watermark = gauge(
            "onceflow_partition_high_watermark",
            "What consumers may read up to: the ISR's high watermark, on the partition's leader.",
        )
        stable = gauge(
            "onceflow_partition_last_stable_offset",
            "Where read_committed consumers stop: the first open transaction's, else the high watermark.",
        )
        lso_lag = gauge(
            "kafka_cluster_partition_last_stable_offset_lag",
            "High watermark minus last stable offset: what open transactions hold back "
            "from read_committed consumers (LastStableOffsetLag).",
        )
        in_sync = gauge(
            "kafka_cluster_partition_in_sync_replicas_count", "The ISR's size (InSyncReplicasCount)."
        )
        assigned = gauge("kafka_cluster_partition_replicas_count", "Assigned replicas (ReplicasCount).")
        for replica in replicas:
            values = [replica.topic, str(replica.partition)]
            log_end.add_metric(values, replica.log.log_end_offset)
            log_start.add_metric(values, replica.log.log_start_offset)
            size.add_metric(values, replica.log.size_bytes)
            if replica.leader:
                lso = replica.log.last_stable_offset(replica.high_watermark)
                high_watermark.add_metric(values, replica.high_watermark)
                stable.add_metric(values, lso)
                lso_lag.add_metric(values, replica.high_watermark - lso)
                in_sync.add_metric(values, replica.in_sync)
                assigned.add_metric(values, replica.replicas)
        yield from (log_end, log_start, size, high_watermark, stable, lso_lag, in_sync, assigned)

    def _transaction_metrics(self, coordinators: Iterable[TransactionCoordinator]) -> Iterator[Metric]:
        now_ms = int(time.time() * 1000)
        transactions = [
            metadata for coordinator in coordinators for metadata in coordinator.transactions.values()
        ]
        open_starts = [metadata.start_ms for metadata in transactions if not metadata.state.is_complete]
        count = GaugeMetricFamily(
            "onceflow_transactions_open", "Transactions begun and not yet completed (Ongoing or Prepare*)."
        )
        count.add_metric([], len(open_starts))
        oldest = GaugeMetricFamily(
            "onceflow_transactions_oldest_open_age_seconds",
            "Age of the oldest open transaction; 0 when none is open.",
        )
        oldest.add_metric([], max(0, now_ms - min(open_starts)) / 1000 if open_starts else 0)
        ids = GaugeMetricFamily(
            "onceflow_transactional_ids",
            "Transactional ids the transaction coordinator keeps, by state.",
            labels=["state"],
        )
        by_state = collections.Counter(metadata.state.value for metadata in transactions)
        for state, number in sorted(by_state.items()):
            ids.add_metric([state], number)
        yield count
        yield oldest
        yield ids

    def _group_metrics(
        self, coordinators: Iterable[GroupCoordinator], high_watermarks: dict[tuple[str, int], int]
    ) -> Iterator[Metric]:
        labels = ["consumergroup", "topic", "partition"]
        committed = GaugeMetricFamily(
            "kafka_consumergroup_current_offset", "A group's committed offset, per partition.", labels=labels
        )
        lag = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "High watermark minus a group's committed offset, per partition this broker holds.",
            labels=labels,
        )
        groups = GaugeMetricFamily(
            "kafka_coordinator_group_groupmetadatamanager_num_groups",
            "Groups the group coordinators keep, by state (NumGroups, NumGroupsStable, ...).",
            labels=["state"],
        )
        offsets = GaugeMetricFamily(
            "kafka_coordinator_group_groupmetadatamanager_num_offsets",
            "Committed offsets the group coordinators keep (NumOffsets).",
        )
        listings = [
            (coordinator, listing) for coordinator in coordinators for listing in coordinator.list_groups()
        ]
        by_state = collections.Counter(listing.state for _, listing in listings)
        for state in GroupState:
            if state is not GroupState.DEAD:
                groups.add_metric([state.value], by_state[state])
        offset_count = 0
        for coordinator, listing in listings:
            for fetched in coordinator.fetch_offsets(listing.group_id, None, require_stable=False):
                if fetched.offset is None:
                    continue
                offset_count += 1
                topic, partition = fetched.partition
                values = [listing.group_id, topic, str(partition)]
                committed.add_metric(values, fetched.offset.offset)
                hw = high_watermarks.get((topic, partition))
                if hw is not None:  # a partition held here (one deleted since is not)
                    lag.add_metric(values, hw - fetched.offset.offset)
        offsets.add_metric([], offset_count)
        yield committed
        yield lag
        yield groups
        yield offsets


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
