"""The broker's shared state and its background work.

API handlers call into `Broker`; they never touch files or sockets directly.
Durability (group commit), write-behind flushing, retention, producer expiry
and fetch wake-ups live here, on the event loop that the server runs.

A single broker is a cluster of one (`metadata`): it leads every partition, alone in its
ISR. Each replica's state (its role, ISR, followers, high watermark) is a `Partition`
(`broker.partition`): with one replica the high watermark is the flushed offset, so a consumer
never reads a record that a crash could take back (as Kafka's consumers never read past the
ISR's copy); in a cluster it is also no further than any ISR member's copy
(`broker.replication`). The group and transaction coordinators are one state machine per
partition of their internal topics that this broker leads (`broker.coordinator_shards`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.broker.config import BrokerConfig
from onceflow.broker.coordinator_shards import CoordinatorShards, Shard
from onceflow.broker.fetch_sessions import FetchSessions, QuietMark, WantedPartition
from onceflow.broker.markers import BrokerTransactionPartitions, CoordinatorFencedError
from onceflow.broker.metrics import (
    STAGE_HW_TO_FETCH_WAKEUP,
    ControllerState,
    Metrics,
    PrometheusMetrics,
    ReplicaState,
)
from onceflow.broker.partition import Partition
from onceflow.broker.partition_flushes import PartitionFlushes
from onceflow.broker.producer_ids import ProducerIdAllocator
from onceflow.broker.replication import FollowedPartition, LeaderFetcher
from onceflow.broker.security import BrokerSecurity, ClientSecurity
from onceflow.broker.txn_markers import MarkerWriter
from onceflow.cluster.controller import ReplicationFactorError, assign_replicas
from onceflow.cluster.status import cluster_status
from onceflow.cluster.view import ClusterView, one_node_view
from onceflow.cluster.znodes import NO_LEADER, BrokerRegistration
from onceflow.coordinator.group import CONSUMER_OFFSETS_CONFIG, GroupCoordinator
from onceflow.coordinator.group_requests import GroupConfig
from onceflow.coordinator.runtime import DurableLog, PartitionCoordinatorLog, write_error
from onceflow.coordinator.transaction import TRANSACTION_LOG_CONFIG, Awaited, TransactionCoordinator, TxnReply
from onceflow.extras import require
from onceflow.internal_topics import CONSUMER_OFFSETS_TOPIC, TRANSACTION_LOG
from onceflow.log.cleaner import abandon, plan_cleaning, swap_in, write_cleaned_segments
from onceflow.log.errors import LogAppendError, LogError, UnknownTopicError
from onceflow.log.log import PartitionLog
from onceflow.log.manager import LogManager, validate_topic_name
from onceflow.log_limits import once_per_interval

if TYPE_CHECKING:
    from onceflow.cluster.zk import ZooKeeperCluster

log = logging.getLogger(__name__)
_repeated = once_per_interval(__name__)

C = TypeVar("C")

FSYNC_THREADS = 4
# The longest pause between two attempts of a background task that keeps failing.
MAX_BACKOFF_S = 5.0
T = TypeVar("T")
# What a replica fetcher follows: its leader's endpoint, and each partition's leader epoch.
_Followed: TypeAlias = tuple[tuple[str, int], dict[tuple[str, int], int]]
# How long a transaction coordinator's write waits for its partition's ISR (Kafka's
# request.timeout.ms, which its TransactionStateManager uses).
TRANSACTION_WRITE_TIMEOUT_S = 30.0
GroupShard: TypeAlias = Shard[GroupCoordinator]
TransactionShard: TypeAlias = Shard[TransactionCoordinator]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Endpoint:
    node_id: int
    host: str
    port: int


class Broker:
    def __init__(self, data_dir: Path, config: BrokerConfig, metrics: bool = False) -> None:
        if config.get("zookeeper.connect"):
            require("onceflow broker --zookeeper", "kazoo", "cluster", ("kazoo",))
        self.config = config
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.logs = LogManager(data_dir, config.log_config, now_ms())
        self.logs.on_failure = self._halt
        self.security = BrokerSecurity(config, data_dir)
        # None without authorizer.class.name: every request is served as before, unchecked.
        self.authorizer = self.security.authorizer
        # Each listener's advertised address, and how this broker reaches the others' (`start`).
        self.listener_endpoints: dict[str, tuple[str, int]] = {}
        self.inter_broker_listener = "PLAINTEXT"
        self.inter_broker = ClientSecurity(None, None)
        self.cluster: ZooKeeperCluster | None = None
        self.fetch_sessions = FetchSessions()  # followers' (cluster mode)
        if config.get("zookeeper.connect"):
            from onceflow.cluster.zk import ZooKeeperCluster

            self.cluster = ZooKeeperCluster(
                config.get("zookeeper.connect"),
                config.get_int("node.id"),
                config.get_int("zookeeper.session.timeout.ms"),
                config.get_int("zookeeper.connection.timeout.ms"),
                config.get_bool("unclean.leader.election.enable"),
                self._cluster_changed,
            )
        # A cluster's brokers take producer id blocks from ZooKeeper, so that no two hand out one id.
        self.producer_ids = ProducerIdAllocator(
            data_dir, self.cluster.reserve_producer_ids if self.cluster is not None else None
        )
        self.node_id = config.get_int("node.id")
        self.cluster_id = config.get("cluster.id")
        self.endpoint = Endpoint(self.node_id, "127.0.0.1", 0)
        # A single broker's view of itself as a cluster of one, made again when its topics change.
        self._local_view: ClusterView | None = None
        self._local_view_changes = -1
        # This broker's replicas with their roles, by partition and by log (flushes name logs).
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._partitions_by_log: dict[DurableLog, Partition] = {}
        # One timer at the groups' next deadline, so that sessions and rebalances time out on time.
        self._group_timer: asyncio.TimerHandle | None = None
        self._group_timer_at_ms: int | None = None
        self._group_config = GroupConfig.from_kafka(config.props)
        self.groups: CoordinatorShards[GroupCoordinator] = CoordinatorShards(
            CONSUMER_OFFSETS_TOPIC,
            self._build_group_shard,
            self._group_shard_loaded,
            self._group_shard_resigned,
        )
        self.transactions: CoordinatorShards[TransactionCoordinator] = CoordinatorShards(
            TRANSACTION_LOG, self._build_transaction_shard, self._transaction_shard_loaded, self._resigned
        )
        self.markers = MarkerWriter(self)
        # Phase two under way, by transactional id, with the shard that runs it.
        self._completions: dict[str, tuple[TransactionShard, asyncio.Task[None]]] = {}
        self.metrics = PrometheusMetrics(self) if metrics else Metrics()
        # Long-polling fetches by the partitions they read: a flush wakes only the fetches
        # waiting on the partitions it flushed (Kafka's delayed fetches, keyed by partition).
        # Waiters get the perf_counter() time of their wake-up, to time the stages after it.
        self._fetch_waiters: dict[DurableLog, set[asyncio.Future[float | None]]] = {}
        # Followers' fetches: they copy what the leader appended, fsynced or not, so an append
        # wakes them (the leader's own fsync runs meanwhile, beside the copying).
        self._append_waiters: dict[DurableLog, set[asyncio.Future[float | None]]] = {}
        # acks=all answers waiting for fsyncs, by the partitions they still wait on.
        self._durability_waits: dict[DurableLog, list[_DurabilityWait]] = {}
        self._fsync_threads = ThreadPoolExecutor(
            max_workers=FSYNC_THREADS, thread_name_prefix="onceflow-fsync"
        )
        self._flushes = PartitionFlushes(
            self._fsync_threads,
            self.metrics.flushed,
            self._flush_ended,
            self._flush_failed,
            lambda: self.metrics.storage_error("flushing"),
        )
        # Set at the first failed fsync: the broker halts (its host stops it without a flush).
        self.storage_failure: str | None = None
        self.halted = asyncio.Event()
        # Cleaning reads and writes whole segments: one thread of its own, as Kafka's cleaner.
        self._cleaner_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-cleaner")
        # Record-level work too long for the event loop (a batch of many records to validate,
        # a recompression, a ListOffsets search through large batches).
        self._record_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-records")
        self._tasks: list[asyncio.Task[None]] = []
        # Cluster mode: a fetcher per leader this broker follows (with what it follows there),
        # and the ISR changes it is writing.
        self._cluster_topics: frozenset[str] = frozenset()  # in the last view
        self._fetchers: dict[int, tuple[_Followed, asyncio.Task[None]]] = {}
        self._isr_changes: set[asyncio.Task[None]] = set()

    # -- lifecycle -------------------------------------------------------------
    def start(
        self,
        listener_endpoints: dict[str, tuple[str, int]],
        inter_broker_listener: str,
        inter_broker: ClientSecurity | None = None,
    ) -> None:
        """`listener_endpoints`: each listener's advertised address; the inter-broker
        listener's is the one other brokers (and a single listener's clients) are given."""
        self.listener_endpoints = dict(listener_endpoints)
        self.inter_broker_listener = inter_broker_listener
        self.endpoint = Endpoint(self.node_id, *listener_endpoints[inter_broker_listener])
        self._local_view = None  # it names the endpoint
        if inter_broker is not None:
            self.inter_broker = inter_broker
        self._flushes.start()
        self._tasks = self._background_tasks()
        if self.cluster is None:
            # A single broker leads what it holds; its coordinators load before it serves, and
            # transactions left prepared by a crash complete now.
            self._take_roles(self.metadata)

    async def join_cluster(self) -> None:
        """In cluster mode, register with ZooKeeper (after `start`, which knows the endpoint).
        The views that follow give this broker its roles."""
        if self.cluster is not None:
            await self.cluster.join(self.endpoint.host, self.endpoint.port, self.listener_endpoints)
            await self.security.use_zookeeper(self.cluster.client)
            self.producer_ids.ready()  # a first block of producer ids, asked for ahead of need

    async def stop(self) -> None:
        # Leave the cluster first, so that the others elect new leaders at once.
        if self.cluster is not None:
            cluster_tasks: list[asyncio.Task[Any]] = [fetcher for _, fetcher in self._fetchers.values()]
            cluster_tasks += self._isr_changes
            for task in cluster_tasks:
                task.cancel()
            await asyncio.gather(*cluster_tasks, return_exceptions=True)
            await self.security.close()
            await self.cluster.leave()
        # A transaction stopped half-way stays Prepare* in its log and completes at the next load.
        self.groups.resign_all_but(set())
        self.transactions.resign_all_but(set())
        if self._group_timer is not None:
            self._group_timer.cancel()
        stopping = [*self._tasks, *(task for _, task in self._completions.values())]
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        for waiters in self._fetch_waiters.values():
            for waiter in waiters:
                waiter.cancel()
        await self._flushes.stop()
        # After a failed fsync, another one may succeed without the data: no flush, no checkpoint.
        close = partial(self.logs.close, flush=self.storage_failure is None)
        await asyncio.get_running_loop().run_in_executor(self._fsync_threads, close)
        self._fsync_threads.shutdown(wait=True)
        self._cleaner_thread.shutdown(wait=True)
        self._record_thread.shutdown(wait=True)

    def run_disk_work(self, work: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`work(*args)` on a thread of the fsync pool: file work too long for the event loop
        (making thousands of partitions), on files the broker does not use yet."""
        return asyncio.get_running_loop().run_in_executor(self._fsync_threads, work, *args)

    def run_record_work(self, work: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`work(*args)` on the record thread: work on bytes it was given, or reads of a log's
        segments inside `PartitionLog.segments_pinned`; never a write to the logs."""
        return asyncio.get_running_loop().run_in_executor(self._record_thread, work, *args)

    # -- metadata ----------------------------------------------------------------
    @property
    def metadata(self) -> ClusterView:
        """What this broker knows of its cluster: ZooKeeper's view, or, for a single broker, a
        cluster of one that it leads every partition of."""
        if self.cluster is not None:
            return self.cluster.view
        if self._local_view is None or self._local_view_changes != self.logs.changes:
            registration = BrokerRegistration(self.node_id, self.endpoint.host, self.endpoint.port)
            topics = {name: (info.topic_id, info.partitions) for name, info in self.logs.topics.items()}
            configs = {name: dict(info.configs) for name, info in self.logs.topics.items()}
            self._local_view = one_node_view(registration, topics, configs)
            self._local_view_changes = self.logs.changes
        return self._local_view

    # -- coordinators ------------------------------------------------------------
    def coordinator(self, shards: CoordinatorShards[C], key: str) -> Shard[C] | ErrorCode:
        """The shard of `shards` that coordinates `key` here, or the error to answer with
        (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS). The internal topic is created when it
        is missing (`ensure_internal_topic`)."""
        if not shards.partition_count:
            self.ensure_internal_topic(shards.topic)
        return shards.for_key(key)

    def ensure_internal_topic(self, topic: str) -> None:
        """Create a coordinator's internal topic when it does not exist yet, as Kafka does at the
        first FindCoordinator: a single broker at once, with one replica of each partition; a
        cluster once `*.replication.factor` brokers are live (until then clients hear
        COORDINATOR_NOT_AVAILABLE), through ZooKeeper like any topic."""
        view = self.metadata
        if view.partition_count(topic):
            return
        if topic == CONSUMER_OFFSETS_TOPIC:
            partitions = self.config.get_int("offsets.topic.num.partitions")
            factor = self.config.get_int("offsets.topic.replication.factor")
            configs = {
                **CONSUMER_OFFSETS_CONFIG,
                "segment.bytes": self.config.get("offsets.topic.segment.bytes"),
            }
        else:
            partitions = self.config.get_int("transaction.state.log.num.partitions")
            factor = self.config.get_int("transaction.state.log.replication.factor")
            configs = {
                **TRANSACTION_LOG_CONFIG,
                "segment.bytes": self.config.get("transaction.state.log.segment.bytes"),
            }
        if self.cluster is None:
            factor = 1
        if topic == TRANSACTION_LOG:
            # Kafka's transaction.state.log.min.isr, as far as the replicas go.
            min_isr = min(self.config.get_int("transaction.state.log.min.isr"), factor)
            configs["min.insync.replicas"] = str(min_isr)
        # A deposed leader's partition must never come back with less than what it acknowledged.
        configs["unclean.leader.election.enable"] = "false"
        if self.cluster is None:
            try:
                self.logs.create_topic(topic, partitions, configs)
            except LogError as error:
                # Asked again at the next FindCoordinator; a full disk is no internal error.
                log.warning("cannot create %s: %s", topic, error)
                return
            self._take_roles(self.metadata)
            return
        try:
            replicas = assign_replicas(topic, partitions, factor, view.brokers)
        except ReplicationFactorError as error:
            log.info("%s is not created yet: %s", topic, error)
            return
        self.cluster.create_topic_soon(topic, replicas, configs)

    def auto_create_topic(self, name: str) -> ErrorCode:
        """Create a topic a client asked for (auto.create.topics.enable), with num.partitions:
        a single broker at once (NONE); a cluster through ZooKeeper in the background
        (LEADER_NOT_AVAILABLE meanwhile, as Kafka answers while it creates one); else why not."""
        partitions = self.config.get_int("num.partitions")
        if self.cluster is None:
            try:
                self.logs.create_topic(name, partitions, {})
            except LogError as error:
                return error.error_code
            return ErrorCode.none
        try:
            validate_topic_name(name)
            factor = self.config.get_int("default.replication.factor")
            replicas = assign_replicas(name, partitions, factor, self.metadata.brokers)
        except LogError as error:
            return error.error_code
        except ReplicationFactorError:
            return ErrorCode.invalid_replication_factor
        self.cluster.create_topic_soon(name, replicas)
        return ErrorCode.leader_not_available

    def coordinators(self) -> tuple[list[TransactionCoordinator], list[GroupCoordinator]]:
        """The coordinators loaded here: one per internal partition this broker leads."""
        return (
            [shard.coordinator for shard in self.transactions.loaded()],
            [shard.coordinator for shard in self.groups.loaded()],
        )

    def _coordinator_log(
        self, shards: CoordinatorShards[Any], index: int, epoch: int
    ) -> PartitionCoordinatorLog:
        """The log of a shard elected at `epoch`: its appends go through only while this broker
        still leads the partition in that leadership and its ISR has min.insync.replicas members,
        as Kafka's coordinators append with acks=all."""
        topic = shards.topic
        partition = self._partitions[topic, index]

        def leadership() -> int | None:
            if (
                not (shards.leads_at(index, epoch) and self._partitions.get((topic, index)) is partition)
                or not partition.is_leader
            ):
                raise LogAppendError(
                    ErrorCode.not_leader_or_follower, f"this broker no longer leads {topic}-{index}"
                )
            min_isr = self.min_insync_replicas(topic)
            if len(partition.isr) < min_isr:
                raise LogAppendError(
                    ErrorCode.not_enough_replicas,
                    f"{topic}-{index} has {len(partition.isr)} replicas in sync, fewer than {min_isr}",
                )
            return partition.stamped_epoch

        return PartitionCoordinatorLog(partition.log, leadership)

    @property
    def coordinator_load_seconds(self) -> dict[str, float]:
        """The longest load of a partition of each coordinator's internal topic."""
        return {"group": self.groups.longest_load_s, "transaction": self.transactions.longest_load_s}

    def _build_group_shard(self, index: int, epoch: int) -> tuple[GroupCoordinator, Iterator[None]]:
        coordinator = GroupCoordinator(
            self._coordinator_log(self.groups, index, epoch),
            self.partition_exists,
            self._group_config,
            now_ms(),
            self._schedule_group_timer,
            replay=False,
        )
        return coordinator, coordinator.load(now_ms())

    def _group_shard_loaded(self, shard: GroupShard) -> None:
        deadline = shard.coordinator.next_deadline_ms()
        if deadline is not None:
            self._schedule_group_timer(deadline)

    def _group_shard_resigned(self, shard: GroupShard) -> None:
        shard.coordinator.unload()
        self._wake_everyone()  # commits waiting on its partition's ISR hear NOT_COORDINATOR

    def _build_transaction_shard(
        self, index: int, epoch: int
    ) -> tuple[TransactionCoordinator, Iterator[None]]:
        coordinator = TransactionCoordinator(
            self._coordinator_log(self.transactions, index, epoch),
            BrokerTransactionPartitions(self, epoch, lambda: self.transactions.leads_at(index, epoch)),
            self.producer_ids.allocate,
            self.config.get_int("transaction.max.timeout.ms"),
            self.config.get_int("transactional.id.expiration.ms"),
            replay=False,
        )
        return coordinator, coordinator.load()

    def _transaction_shard_loaded(self, shard: TransactionShard) -> None:
        """Finish what the partition's last leader (or this broker, before a crash) left
        prepared: the markers go to every partition's current leader."""
        for transactional_id in shard.coordinator.pending_completions():
            self.complete_transaction(shard, transactional_id)

    def _resigned(self, shard: TransactionShard) -> None:
        """Phase two of its transactions stops here: the partition's new leader finishes it."""
        for transactional_id, (running_shard, task) in list(self._completions.items()):
            if running_shard is shard:
                task.cancel()
                del self._completions[transactional_id]
        self._wake_everyone()

    # -- transactions ----------------------------------------------------------
    def settle(self, shard: TransactionShard, reply: TxnReply[Any]) -> Awaitable[ErrorCode]:
        """Do what a transaction coordinator's reply asks: start the phase two it names now;
        the awaitable ends when the client may have the reply, with NONE, or the error to answer
        instead (its writes could not be committed, or phase two was cut short)."""
        completions = [
            self.complete_transaction(shard, transactional_id) for transactional_id in reply.completions
        ]
        return self._settled(reply.committed, completions if reply.answer_after_completion else [])

    async def _settled(
        self, committed: tuple[DurableLog, ...], completions: list[asyncio.Task[None]]
    ) -> ErrorCode:
        code = await self.wait_committed(committed, TRANSACTION_WRITE_TIMEOUT_S)
        if code != ErrorCode.none:
            return write_error(code)
        for completion in completions:
            await asyncio.wait([completion])
            if completion.cancelled():
                return ErrorCode.not_coordinator  # the partition's leadership went meanwhile
            if completion.exception() is not None:
                return ErrorCode.coordinator_not_available  # it stays prepared; a retry finds it done
        return ErrorCode.none

    def complete_transaction(self, shard: TransactionShard, transactional_id: str) -> asyncio.Task[None]:
        """Phase two of a prepared transaction, once per transaction at a time."""
        running = self._completions.get(transactional_id)
        if running is not None and running[0] is shard and not running[1].done():
            return running[1]
        steps = shard.coordinator.complete(transactional_id, now_ms())
        task = asyncio.create_task(self._until_committed(shard, steps), name=f"complete-{transactional_id}")
        self._completions[transactional_id] = (shard, task)
        task.add_done_callback(lambda done: self._completion_done(transactional_id, done))
        return task

    def _completion_done(self, transactional_id: str, task: asyncio.Task[None]) -> None:
        running = self._completions.get(transactional_id)
        if running is not None and running[1] is task:
            del self._completions[transactional_id]
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, CoordinatorFencedError):
            log.warning("completing transaction %r stopped: %s", transactional_id, error)
        elif error is not None:
            log.error(
                "completing transaction %r failed; it stays prepared and is tried again",
                transactional_id,
                exc_info=error,
            )

    async def _until_committed(self, shard: TransactionShard, steps: Iterator[tuple[Awaited, ...]]) -> None:
        """Run a coordinator's steps, each once the logs the one before named are committed
        and its markers written. It stops when the shard loses its partition (its successor
        finishes) or a write fails (the sweep starts it again)."""
        for step in steps:
            logs = [awaited for awaited in step if not isinstance(awaited, Awaitable)]
            markers = [awaited for awaited in step if isinstance(awaited, Awaitable)]
            self.appended(logs)
            code = await self.wait_committed(logs, TRANSACTION_WRITE_TIMEOUT_S)
            if code != ErrorCode.none:
                raise LogAppendError(code, "a write of phase two was not committed")
            try:
                # Cancelled with this phase two (the broker stops, or the shard resigns), they stop too.
                await asyncio.gather(*markers)
            except BaseException:
                for marker in markers:
                    if isinstance(marker, asyncio.Future):
                        marker.cancel()
                raise
            if not self.transactions.current(shard):
                raise CoordinatorFencedError("the shard resigned; the partition's new leader finishes it")

    def _sweep_transactions(self) -> None:
        """Abort transactions past their timeout (fencing their producer), finish prepared ones
        and expire idle ids, in every shard this broker coordinates."""
        for shard in self.transactions.loaded():
            shard.coordinator.abort_timed_out(now_ms())
            # Newly timed out, and any whose completion failed (a full disk, say): retry.
            for transactional_id in shard.coordinator.pending_completions():
                self.complete_transaction(shard, transactional_id)
            shard.coordinator.expire_idle_ids(now_ms())

    # -- cluster mode ----------------------------------------------------------------
    def _cluster_changed(self, view: ClusterView) -> None:
        """Open the local logs of the topics this broker holds a replica of, with the topic id
        and configs every broker shares, and apply configs changed since (AlterConfigs). Delete
        the replicas of topics deleted since, and of topics deleted and created again."""
        for topic, info in list(self.logs.topics.items()):
            assignment = view.topics.get(topic)
            deleted = assignment is None and topic in self._cluster_topics
            if deleted or (assignment is not None and assignment.topic_id != info.topic_id):
                self._delete_replicas(topic)
        self._cluster_topics = frozenset(view.topics)
        for topic, assignment in view.topics.items():
            configs = view.topic_configs.get(topic, {})
            held = self.logs.topics.get(topic)
            if held is not None:
                if held.configs != configs:
                    self._apply_topic_configs(topic, configs)
                if held.partitions < len(assignment.replicas):
                    self._add_partitions(topic, len(assignment.replicas))
                continue
            if not any(self.node_id in nodes for nodes in assignment.replicas):
                continue
            try:
                self.logs.create_topic(topic, len(assignment.replicas), configs, assignment.topic_id)
            except LogError:
                log.exception("cannot open the local log of topic %r", topic)
        self._take_roles(view)
        self._wake_everyone()

    def _delete_replicas(self, topic: str) -> None:
        # The fetchers that follow some of its partitions stop; `_take_roles`, next, starts them again.
        for leader_id, ((_, epochs), fetcher) in list(self._fetchers.items()):
            if any(key[0] == topic for key in epochs):
                fetcher.cancel()
                del self._fetchers[leader_id]
        for key in [key for key in self._partitions if key[0] == topic]:
            self._forget_partition(key)
        try:
            self.logs.delete_topic(topic)
        except LogError:
            log.exception("cannot delete the local replicas of topic %r", topic)
        else:
            log.info("deleted the local replicas of topic %r", topic)

    def _add_partitions(self, topic: str, partitions: int) -> None:
        try:
            self.logs.create_partitions(topic, partitions)
        except LogError:
            log.exception("cannot open the new partitions of topic %r", topic)

    def _apply_topic_configs(self, topic: str, configs: Mapping[str, str]) -> None:
        try:
            self.logs.alter_topic_configs(topic, configs)
        except LogError:
            log.exception("cannot apply the new configs of topic %r", topic)
        else:
            log.info("topic %r now has configs %s", topic, dict(configs))

    def _take_roles(self, view: ClusterView) -> None:
        """Lead what the view says this broker leads, follow the rest, and coordinate the
        partitions of the internal topics it leads: a coordinator loads on becoming the leader
        and is dropped when the leadership goes. A single broker's load before this returns."""
        following: dict[int, dict[tuple[str, int], int]] = {}  # leader -> partition -> its epoch
        held: set[tuple[str, int]] = set()
        for topic, assignment in view.topics.items():
            for index, replicas in enumerate(assignment.replicas):
                partition_log = self.logs.get(topic, index)
                if self.node_id not in replicas or partition_log is None:
                    continue
                key = (topic, index)
                held.add(key)
                partition = self._partitions.get(key)
                if partition is None or partition.log is not partition_log:
                    if partition is not None:
                        self._forget_partition(key)
                    partition = Partition(topic, index, partition_log, self.node_id, self.cluster is not None)
                    self._partitions[key] = partition
                    self._partitions_by_log[partition_log] = partition
                state = view.states.get(key)
                version = view.state_versions.get(key, -1)
                if state is not None and state.leader == self.node_id:
                    partition.make_leader(state.leader_epoch, replicas, state.isr, version, now_ms())
                elif state is None:
                    partition.make_follower(NO_LEADER, 0, replicas, (), version)
                else:
                    partition.make_follower(state.leader, state.leader_epoch, replicas, state.isr, version)
                    if state.leader in view.brokers:
                        following.setdefault(state.leader, {})[key] = state.leader_epoch
        for key in set(self._partitions) - held:
            self._forget_partition(key)
        for shards in (self.groups, self.transactions):
            shards.partition_count = view.partition_count(shards.topic)
            led = {
                key[1]: partition.leader_epoch
                for key, partition in self._partitions.items()
                if key[0] == shards.topic and partition.is_leader
            }
            shards.resign_all_but(set(led))
            for index in sorted(led):
                # A single broker's at once: at its start, before it serves, and later those of an
                # internal topic just created, empty, which the request that made it goes on to use.
                shards.elect(index, led[index], at_once=self.cluster is None)
        self._follow(view, following)

    def _forget_partition(self, key: tuple[str, int]) -> None:
        partition = self._partitions.pop(key)
        self._partitions_by_log.pop(partition.log, None)
        partition.forget(time.perf_counter())

    def _follow(self, view: ClusterView, following: dict[int, dict[tuple[str, int], int]]) -> None:
        """One fetcher per leader followed, started again when what it follows there changes."""
        wanted = {
            leader_id: ((view.brokers[leader_id].host, view.brokers[leader_id].port), epochs)
            for leader_id, epochs in following.items()
        }
        for leader_id, (followed, running) in list(self._fetchers.items()):
            if wanted.get(leader_id) != followed:
                running.cancel()
                del self._fetchers[leader_id]
        for leader_id, followed in wanted.items():
            if leader_id in self._fetchers:
                continue
            leader, epochs = followed
            partitions = [
                FollowedPartition(
                    *key, self._partitions[key].log, epoch, self._partitions[key].known_high_watermark
                )
                for key, epoch in epochs.items()
            ]
            # After a cut, the recovery point on disk goes down with it before the appends that
            # follow (Kafka's truncateTo checkpoints too): a crash would otherwise trust them
            # unchecked, as below a point they never reached.
            fetcher = LeaderFetcher(
                self.node_id,
                leader,
                partitions,
                self._follower_appended,
                self.logs.write_recovery_checkpoint,
                self.inter_broker,
            )
            task = asyncio.create_task(fetcher.run(), name=f"fetch-from-{leader_id}")
            self._fetchers[leader_id] = (followed, task)

    def partition(self, topic: str, index: int) -> Partition | None:
        """This broker's replica of the partition, with its role; None when it holds none. A
        single broker takes its roles again when its topics changed since it last did."""
        partition_log = self.logs.get(topic, index)
        if partition_log is None:
            return None
        return self._replica(topic, index, partition_log)

    def _replica(self, topic: str, index: int, partition_log: PartitionLog) -> Partition | None:
        partition = self._partitions.get((topic, index))
        if (partition is None or partition.log is not partition_log) and self.cluster is None:
            self._take_roles(self.metadata)
            partition = self._partitions.get((topic, index))
        return partition if partition is not None and partition.log is partition_log else None

    def _follower_appended(self, topic: str, index: int, partition_log: PartitionLog, hw: int) -> None:
        partition = self._partitions.get((topic, index))
        if partition is not None and partition.log is partition_log:
            partition.learned_high_watermark(hw)
        self.appended([partition_log])

    def is_replica(self, topic: str, index: int, broker_id: int) -> bool:
        """Whether `broker_id` is assigned a replica of the partition."""
        partition = self._partitions.get((topic, index))
        return partition is not None and broker_id in partition.replicas

    def follower_fetched(self, topic: str, index: int, replica_id: int, fetch_offset: int) -> None:
        """A follower fetched at `fetch_offset`: that is its log end now. Only a moved high
        watermark wakes anyone: a long-polling follower re-reads (and so comes here) on every
        wake-up, and waking the others each time would make them spin."""
        partition = self._partitions.get((topic, index))
        if partition is None:
            return
        moved, joining = partition.follower_fetched(replica_id, fetch_offset, now_ms())
        if moved:
            self._wake_fetches([partition.log])  # consumers at the high watermark, and acks=all produces
        if joining is not None:
            self._change_isr(partition, joining)

    def follower_caught_up(
        self, topic: str, replica_id: int, wanted: WantedPartition, now_ms: int
    ) -> PartitionLog | None:
        """A partition of a follower's session that it has all of: its log when this broker
        leads it at the epoch the follower names, the follower is at the log end, and the high
        watermark, last stable offset and log start are still those last answered; None
        otherwise. The fetch then counts the follower as caught up and has nothing to tell it:
        skipping the full read keeps a session's idle partitions cheap on every fetch. Found
        caught up, a partition is marked so (`wanted.quiet`) until `recheck_quiet` finds it
        changed."""
        sent = wanted.sent
        partition = self._partitions.get((topic, wanted.partition))
        if sent is None or partition is None or partition.leader_epoch != wanted.current_leader_epoch:
            return None
        partition_log = partition.log
        if self.logs.get(topic, wanted.partition) is not partition_log:
            return None
        if not partition.unchanged_for(replica_id, wanted.fetch_offset, sent, now_ms):
            return None
        wanted.quiet = QuietMark(
            partition,
            partition.version,
            partition_log.log_end_offset,
            partition_log.flushed_offset,
            partition_log.log_start_offset,
            wanted.fetch_offset,
            wanted.current_leader_epoch,
            sent,
        )
        return partition_log

    def recheck_quiet(self, replica_id: int, session: Iterable[WantedPartition], now_ms: int) -> None:
        """Of a follower's session partitions marked caught up (`follower_caught_up`), keep those
        for which nothing the mark depended on changed, counting the follower caught up on each,
        and unmark the others, which the fetch then reads in full. Once a fetch read, in one
        pass of comparisons: most of a session is idle, and a call or two per idle partition
        was a fifth of the Python calls of a replicated produce."""
        for wanted in session:
            mark = wanted.quiet
            if mark is None:
                continue
            partition = mark.partition
            log = partition.log
            if (
                partition.version == mark.version
                and log.log_end_offset == mark.log_end_offset
                and log.flushed_offset == mark.flushed_offset
                and log.log_start_offset == mark.log_start_offset
                and wanted.fetch_offset == mark.fetch_offset
                and wanted.current_leader_epoch == mark.leader_epoch
                and wanted.sent == mark.sent
                and not log.closed
            ):
                partition.caught_up(replica_id, now_ms)
            else:
                wanted.quiet = None

    def _change_isr(self, partition: Partition, isr: tuple[int, ...]) -> None:
        """Write the partition's new ISR to ZooKeeper (a compare-and-set on the state this broker
        last read, keeping the leader epoch); the high watermark counts the maximal ISR until
        the metadata shows the change (KIP-497)."""
        assert self.cluster is not None
        change = partition.begin_isr_change(isr)
        if change is None:
            return
        cluster = self.cluster

        async def write() -> None:
            written = await cluster.change_isr(partition.topic, partition.index, isr)
            partition.isr_change_written(change, written)
            if written:
                self.metrics.isr_changed(shrunk=False)
            self._wake_fetches([partition.log])

        task = asyncio.create_task(write(), name=f"isr-{partition.topic}-{partition.index}")
        self._isr_changes.add(task)
        task.add_done_callback(self._isr_changes.discard)

    def replica_states(self) -> list[ReplicaState]:
        """Every partition this broker holds, as its metrics read it: whether it leads it, the
        high watermark (`Partition.high_watermark`), and its replicas and ISR."""
        states = []
        for topic, index, partition_log in self.logs.partitions():
            min_insync = self.min_insync_replicas(topic)
            partition = self._replica(topic, index, partition_log)
            if partition is None:  # a cluster's topic not in this broker's view yet
                states.append(ReplicaState(topic, index, partition_log, False, 0, 0, 0, min_insync))
                continue
            states.append(
                ReplicaState(
                    topic,
                    index,
                    partition_log,
                    partition.is_leader,
                    partition.high_watermark(),
                    len(partition.replicas),
                    len(partition.isr),
                    min_insync,
                )
            )
        return states

    def controller_state(self) -> ControllerState:
        """Whether this broker is the active controller, and then how many partitions of the
        cluster have no live leader."""
        if self.cluster is None:
            return ControllerState(True, 0)
        view = self.cluster.view
        if view.controller_id != self.node_id:
            return ControllerState(False, 0)
        return ControllerState(True, len(cluster_status(view).offline))

    def high_watermark(self, topic: str, index: int, partition_log: PartitionLog) -> int:
        """What consumers may read (`Partition.high_watermark`); 0 for a log that this broker
        holds no role for (a cluster's topic not in its view yet)."""
        partition = self._replica(topic, index, partition_log)
        return 0 if partition is None else partition.high_watermark()

    def leader_epoch(self, topic: str, index: int) -> int | None:
        """The epoch this broker leads the partition in, to stamp on batches and check fetches
        against; None when it does not lead it, and on a single broker, whose partitions never
        change leader."""
        partition = self._partitions.get((topic, index))
        return None if partition is None else partition.stamped_epoch

    async def wait_replicated(
        self, targets: list[tuple[str, int, PartitionLog, int]], timeout_s: float
    ) -> dict[tuple[str, int], ErrorCode]:
        """For each (topic, partition, log, end), once the high watermark reached `end` in that
        log while this broker led the partition: NONE, or NOT_ENOUGH_REPLICAS_AFTER_APPEND if the
        ISR had shrunk below `min.insync.replicas` meanwhile (then the leader alone may hold it,
        as Kafka's checkEnoughReplicasReachOffset says); else NOT_LEADER_OR_FOLLOWER if the
        leadership (or the log) went, REQUEST_TIMED_OUT past the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            # A topic deleted and created again meanwhile has a new log: the batch went with the old.
            held = {
                (topic, index): partition
                for topic, index, partition_log, _ in targets
                if (partition := self._partitions.get((topic, index))) is not None
                and partition.is_leader
                and partition.log is partition_log
            }
            done = {
                (topic, index): key_held is not None and key_held.high_watermark() >= end
                for topic, index, _, end in targets
                for key_held in [held.get((topic, index))]
            }
            remaining = deadline - time.monotonic()
            if all(done.values()) or len(held) < len(done) or remaining <= 0:
                return {key: self._replicated(key, reached, key in held) for key, reached in done.items()}
            short = [partition for key, partition in held.items() if not done[key]]
            waiter: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
            for partition in short:
                partition.waiters.add(waiter)
            try:
                await _woken_or_timed_out(waiter, remaining)
            finally:
                for partition in short:
                    partition.waiters.discard(waiter)

    def _replicated(self, key: tuple[str, int], reached: bool, held: bool) -> ErrorCode:
        if not held:
            return ErrorCode.not_leader_or_follower
        if not reached:
            return ErrorCode.request_timed_out
        if self.in_sync_replicas(*key) < self.min_insync_replicas(key[0]):
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    async def wait_committed(self, logs: Iterable[DurableLog], timeout_s: float) -> ErrorCode:
        """Once everything appended to `logs` (partitions this broker leads) so far is committed:
        fsynced and, on a partition with other replicas, below its high watermark, as an acks=all
        produce waits. NONE, or the partition's error (`wait_replicated`)."""
        logs = tuple(logs)
        targets = []
        for durable_log in logs:
            partition = self._partitions_by_log.get(durable_log)
            if partition is None:
                return ErrorCode.not_leader_or_follower  # the partition went (a deleted topic)
            targets.append((partition.topic, partition.index, partition.log, partition.log.log_end_offset))
        durable = self.wait_durable(logs)  # asks for the flush now; the high watermark waits for it
        if all(len(self._partitions[topic, index].replicas) <= 1 for topic, index, _, _ in targets):
            await durable
            return ErrorCode.none
        # A coordinator appends without telling anyone: its followers, long-polling, copy it now.
        self.appended(
            log for topic, index, log, end in targets if self._partitions[topic, index].high_watermark() < end
        )
        replicated = await self.wait_replicated(targets, timeout_s)
        return next((code for code in replicated.values() if code != ErrorCode.none), ErrorCode.none)

    def _wake_everyone(self) -> None:
        """Leadership or an ISR changed, which may move any high watermark (or end a wait for
        one): every acks=all produce and every long-polling fetch looks again (a follower's too:
        a partition this broker no longer leads answers its error at once)."""
        woken_at = time.perf_counter()
        for partition in self._partitions.values():
            if partition.waiters:
                partition.wake(woken_at)
        _wake(self._fetch_waiters, list(self._fetch_waiters), woken_at)
        if self._append_waiters:
            _wake(self._append_waiters, list(self._append_waiters), woken_at)

    async def _shrink_isrs(self) -> None:
        """As Kafka's leaders: drop followers that have not caught up for replica.lag.time.max.ms
        from the ISR (a compare-and-set on the state znode, keeping the leader epoch)."""
        assert self.cluster is not None
        lag_ms = self.config.get_int("replica.lag.time.max.ms")
        for partition in list(self._partitions.values()):
            if not partition.is_leader:
                continue
            lagging = partition.lagging(lag_ms, now_ms())
            if not lagging:
                continue
            in_sync = tuple(replica for replica in partition.isr if replica not in lagging)
            change = partition.begin_isr_change(in_sync)
            if change is None:
                continue  # another change is in flight
            log.warning("%s-%d: %s lag, ISR now %s", partition.topic, partition.index, lagging, in_sync)
            written = await self.cluster.change_isr(partition.topic, partition.index, in_sync)
            partition.isr_change_written(change, written)
            if written:
                self.metrics.isr_changed(shrunk=True)

    def leader_elsewhere(self, topic: str, partition: int) -> bool:
        """The partition exists and another broker leads it, or none does."""
        view = self.metadata
        return view.has_partition(topic, partition) and view.leader(topic, partition) != self.node_id

    def current_leader(self, topic: str, partition: int) -> dict[str, int] | None:
        """The partition's leader and epoch as NOT_LEADER_OR_FOLLOWER answers name them (KIP-951),
        so that a client goes there without a Metadata request first."""
        view = self.metadata
        state = view.states.get((topic, partition))
        if state is None:
            return None
        return {"leader_id": view.live_leader(topic, partition), "leader_epoch": state.leader_epoch}

    def known_endpoints(self) -> list[Endpoint]:
        """Every live broker of the cluster (this one alone, for a single broker)."""
        return [Endpoint(node.broker_id, node.host, node.port) for node in self.metadata.brokers.values()]

    def partition_exists(self, partition: tuple[str, int]) -> bool:
        """Whether the partition exists anywhere in the cluster (this broker may hold no replica
        of a topic whose offsets its group coordinator keeps)."""
        return self.metadata.has_partition(*partition)

    def min_insync_replicas(self, topic: str) -> int:
        """The topic's `min.insync.replicas`, else the broker's."""
        configs = self.logs.topics[topic].configs
        return int(configs.get("min.insync.replicas", self.config.get("min.insync.replicas")))

    def in_sync_replicas(self, topic: str, index: int) -> int:
        """How many replicas are in the partition's ISR, as this broker knows it."""
        partition = self.partition(topic, index)
        return 0 if partition is None else len(partition.isr)

    # -- consumer-group timeouts ---------------------------------------------------
    def _schedule_group_timer(self, at_ms: int) -> None:
        if self._group_timer_at_ms is not None and self._group_timer_at_ms <= at_ms:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # replaying the log before start(), which schedules the first timer
        if self._group_timer is not None:
            self._group_timer.cancel()
        self._group_timer_at_ms = at_ms
        self._group_timer = loop.call_later(max(0, at_ms - now_ms()) / 1000, self._fire_group_timers)

    def _fire_group_timers(self) -> None:
        """Session, rebalance, sync and join-delay timeouts that have passed; then the next timer."""
        self._group_timer = None
        self._group_timer_at_ms = None
        deadlines = []
        for shard in self.groups.loaded():
            self.appended(shard.coordinator.tick(now_ms()))
            deadline = shard.coordinator.next_deadline_ms()
            if deadline is not None:
                deadlines.append(deadline)
        if deadlines:
            self._schedule_group_timer(min(deadlines))

    # -- appends and durability ------------------------------------------------
    def appended(self, logs: Iterable[DurableLog]) -> None:
        """Record new data. It becomes visible to fetches once fsynced; a fetch waiting on one
        of `logs` asks for that now."""
        logs = tuple(logs)
        self._flushes.dirty.update(logs)
        if any(partition in self._fetch_waiters for partition in logs):
            self._flushes.request()
        if self._append_waiters:
            _wake(self._append_waiters, logs, time.perf_counter())

    def wait_durable(self, logs: Iterable[DurableLog]) -> asyncio.Future[float]:
        """Done once everything appended to `logs` up to this call is fsynced, with the
        perf_counter() time at which it was. The ends are taken now, not when the caller gets
        to await: appends made meanwhile are not waited for."""
        ends = {partition: partition.log_end_offset for partition in logs}
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        unflushed = {partition: end for partition, end in ends.items() if partition.flushed_offset < end}
        if not unflushed:
            waiter.set_result(time.perf_counter())
            return waiter
        wait = _DurabilityWait(unflushed, waiter)
        for partition in unflushed:
            self._durability_waits.setdefault(partition, []).append(wait)
        self._flushes.dirty.update(unflushed)
        self._flushes.request()
        return waiter

    def read_positions(self, reads: Sequence[tuple[str, int, PartitionLog]], follower: bool) -> list[int]:
        """Where a fetch's read of each (topic, partition, log) stopped: the log's end for a
        follower, which copies unflushed data too; the high watermark for a consumer."""
        return [
            partition_log.log_end_offset if follower else self.high_watermark(topic, partition, partition_log)
            for topic, partition, partition_log in reads
        ]

    async def wait_for_data(
        self,
        reads: Sequence[tuple[str, int, PartitionLog]],
        timeout_s: float,
        seen: Sequence[int],
        follower: bool,
    ) -> None:
        """Sleep until the high watermark of one of the partitions read may have moved or the
        timeout passes. `seen` is where they stood when the fetch read them (`read_positions`):
        a move past that made before this call woke nobody, so it ends the wait at once. A
        follower wakes on any append (acks=all producers wait on its copy), a consumer on a
        flush or, in a cluster, a follower's report (it would wait for the partition's next
        one, or its whole max wait)."""
        if self.read_positions(reads, follower) != list(seen):
            return
        logs = [partition_log for _, _, partition_log in reads]
        waiter: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        waiting = self._append_waiters if follower else self._fetch_waiters
        for partition in logs:
            waiting.setdefault(partition, set()).add(waiter)
        if not follower and any(partition in self._flushes.dirty for partition in logs):
            self._flushes.request()
        try:
            woken_at = await _woken_or_timed_out(waiter, timeout_s)
            if woken_at is not None:
                self.metrics.stage(STAGE_HW_TO_FETCH_WAKEUP, time.perf_counter() - woken_at)
        finally:
            _forget(waiting, logs, waiter)

    def _flush_ended(self, flushed: Collection[DurableLog], flushed_at: float) -> None:
        """A flush moved the flushed offsets of `flushed`: wake the fetches waiting on
        them and release the acks=all answers it made durable."""
        self._wake_fetches(flushed)
        for partition in flushed:
            still_waiting = []
            for wait in self._durability_waits.pop(partition, ()):
                # A log deleted meanwhile will never flush further; its data is gone anyway.
                if partition.flushed_offset >= wait.unflushed[partition] or partition.closed:
                    del wait.unflushed[partition]
                    if not wait.unflushed and not wait.answer.done():
                        wait.answer.set_result(flushed_at)
                else:
                    still_waiting.append(wait)
            if still_waiting:
                self._durability_waits[partition] = still_waiting
                # Mostly asked for already (a wait registered during the flush asks for the
                # next); not when a truncation kept this flush from counting.
                self._flushes.request()

    def _flush_failed(self, partition: DurableLog, error: Exception) -> None:
        """Halt, as Kafka does when its only log directory fails: nothing appended since the
        last good fsync is acknowledged, and a restart recovers from what is on disk."""
        where = getattr(partition, "directory", "a coordinator's log")
        self._halt(f"fsync of {where} failed: {error}")

    def _halt(self, reason: str) -> None:
        """The log directory failed (a failed fsync, a write that could not be taken back)."""
        if self.storage_failure is None:
            self.storage_failure = reason
            log.critical("%s; halting: acknowledging anything now could acknowledge data not on disk", reason)
        self.logs.mark_failed()
        self.halted.set()

    def _wake_fetches(self, logs: Collection[DurableLog]) -> None:
        """The high watermarks of `logs` may have moved: wake the fetches and the acks=all
        produces (cluster mode, only where it did move) waiting on them."""
        woken_at = time.perf_counter()
        for flushed in logs:
            partition = self._partitions_by_log.get(flushed)
            if partition is not None and partition.waiters:
                partition.wake_if_moved(woken_at)
        _wake(self._fetch_waiters, logs, woken_at)

    async def _every(self, what: str, interval_s: float, step: Callable[[], Awaitable[None] | None]) -> None:
        """`step` every `interval_s` for as long as the broker runs. A failure (a full disk, no
        descriptor left) is counted and logged once per interval, and the step is tried again
        after a pause that doubles up to MAX_BACKOFF_S, until it works again."""
        failures = 0
        while True:
            await asyncio.sleep(min(interval_s * 2**failures, max(interval_s, MAX_BACKOFF_S)))
            try:
                stepped = step()
                if stepped is not None:
                    await stepped
            except Exception as error:
                failures += 1
                self.metrics.storage_error(what)
                _repeated.error("%s failed (%s); trying again", what, error)
                continue
            if failures:
                log.warning("%s works again after %d failed attempts", what, failures)
            failures = 0

    def _background_tasks(self) -> list[asyncio.Task[None]]:
        config = self.config
        loop = asyncio.get_running_loop()
        every = {
            # acks=0/1 data nobody waits for is flushed every log.flush.interval.ms.
            "flushing": (max(config.log_config.flush_interval_ms, 10) / 1000, self._write_behind),
            "the recovery checkpoint": (
                max(config.log_config.flush_interval_ms, 10) / 1000,
                lambda: loop.run_in_executor(self._fsync_threads, self.logs.write_recovery_checkpoint),
            ),
            "producer snapshots": (config.get_int("producer.snapshot.interval.ms") / 1000, self._snapshots),
            "retention": (
                config.get_int("log.retention.check.interval.ms") / 1000,
                lambda: self.logs.apply_retention(now_ms()),
            ),
            "producer expiry": (
                config.get_int("producer.id.expiration.check.interval.ms") / 1000,
                self._expire_producers,
            ),
            "the transaction sweep": (
                config.get_int("transaction.abort.timed.out.transaction.cleanup.interval.ms") / 1000,
                self._sweep_transactions,
            ),
        }
        if config.get_bool("log.cleaner.enable"):
            every["the log cleaner"] = (config.get_int("log.cleaner.backoff.ms") / 1000, self._clean_logs)
        if self.cluster is not None:
            every["shrinking ISRs"] = (config.get_int("replica.lag.time.max.ms") / 2000, self._shrink_isrs)
        return [
            asyncio.create_task(self._every(what, interval_s, step), name=what)
            for what, (interval_s, step) in every.items()
        ]

    def _write_behind(self) -> None:
        if self._flushes.dirty:
            self._flushes.request()

    async def _snapshots(self) -> None:
        """Producer state snapshots besides those at segment rolls: they bound the replay after a crash."""
        writers = [partition.producer_snapshot_writer() for _, _, partition in self.logs.partitions()]
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._fsync_threads, _run_each, [w for w in writers if w])

    def _expire_producers(self) -> None:
        for _, _, partition in self.logs.partitions():
            partition.producer_state.remove_expired(now_ms(), partition.config.producer_id_expiration_ms)

    async def _clean_logs(self) -> None:
        """Compact the logs of `cleanup.policy=compact` topics, one partition at a time, every
        log.cleaner.backoff.ms (Kafka's cleaner sleeps that long when it finds nothing to do)."""
        for topic, index, partition in self.logs.partitions():
            await self._clean(topic, index, partition)

    async def _clean(self, topic: str, index: int, partition: PartitionLog) -> None:
        """Clean one partition if it is due, below its high watermark: the writing on the
        cleaner's thread."""
        plan = plan_cleaning(partition, now_ms(), below=self.high_watermark(topic, index, partition))
        if plan is None:
            return
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._cleaner_thread, write_cleaned_segments, plan)
        except UnknownTopicError:
            abandon(plan)  # the topic was deleted meanwhile
            return
        except Exception:
            abandon(plan)
            log.exception("cleaning %s failed; it is tried again later", partition.directory)
            return
        try:
            swap_in(plan, result)
        except OSError:
            # Segments swapped so far are in place; the rest is found again by the next round.
            log.exception("swapping cleaned segments of %s in failed", partition.directory)
            return
        log.info(
            "cleaned %d segments of %s: %d bytes to %d, %d records removed",
            result.segments,
            partition.directory.name,
            result.bytes_before,
            result.bytes_after,
            result.records_removed,
        )


@dataclass
class _DurabilityWait:
    """An acks=all answer's wait: the ends it still waits for, by partition."""

    unflushed: dict[DurableLog, int]
    answer: asyncio.Future[float]


async def _woken_or_timed_out(waiter: asyncio.Future[float | None], timeout_s: float) -> float | None:
    """The waiter's result (a wake-up's perf_counter() time), or None after `timeout_s`. Not
    asyncio.wait_for: its future between the waiter and the task costs every wake-up another
    turn of the event loop, which a busy loop makes a millisecond or more."""
    timer = asyncio.get_running_loop().call_later(timeout_s, _time_out, waiter)
    try:
        return await waiter
    finally:
        timer.cancel()


def _time_out(waiter: asyncio.Future[float | None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _wake(
    waiting: dict[DurableLog, set[asyncio.Future[float | None]]], logs: Iterable[DurableLog], woken_at: float
) -> None:
    for partition in logs:
        for waiter in waiting.pop(partition, ()):
            if not waiter.done():
                waiter.set_result(woken_at)


def _forget(
    waiting: dict[DurableLog, set[asyncio.Future[float | None]]],
    logs: Iterable[DurableLog],
    waiter: asyncio.Future[float | None],
) -> None:
    for partition in logs:
        waiters = waiting.get(partition)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del waiting[partition]


def _run_each(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()
