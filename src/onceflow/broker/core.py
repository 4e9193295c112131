"""The broker's shared state and its background work.

API handlers call into `Broker`; they never touch files or sockets directly.
Durability (group commit), write-behind flushing, retention, producer expiry
and fetch wake-ups live here, on the event loop that the server runs.

With one replica, "replicated" means "fsynced": the high watermark of a
partition is its flushed offset, so a consumer never reads a record that a
crash could take back (as Kafka's consumers never read past the ISR's copy).
In cluster mode it is also no further than any ISR member's copy (`broker.replication`).
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
from onceflow.broker.fetch_sessions import FetchSessions
from onceflow.broker.markers import BrokerTransactionPartitions
from onceflow.broker.metrics import (
    STAGE_HW_TO_FETCH_WAKEUP,
    ControllerState,
    Metrics,
    PrometheusMetrics,
    ReplicaState,
)
from onceflow.broker.partition_flushes import PartitionFlushes
from onceflow.broker.producer_ids import ProducerIdAllocator
from onceflow.broker.replication import FollowedPartition, LeaderFetcher, LeaderState
from onceflow.broker.security import BrokerSecurity, ClientSecurity
from onceflow.broker.txn_markers import ClusterMarkers
from onceflow.cluster.status import cluster_status
from onceflow.cluster.view import ClusterView
from onceflow.coordinator.group import CONSUMER_OFFSETS_CONFIG, CONSUMER_OFFSETS_TOPIC, GroupCoordinator
from onceflow.coordinator.group_requests import GroupConfig
from onceflow.coordinator.runtime import DurableLog, PartitionCoordinatorLog
from onceflow.coordinator.transaction import (
    TRANSACTION_LOG,
    TRANSACTION_LOG_CONFIG,
    Awaited,
    TransactionCoordinator,
    TxnReply,
)
from onceflow.extras import require
from onceflow.log.cleaner import abandon, plan_cleaning, swap_in, write_cleaned_segments
from onceflow.log.errors import LogError
from onceflow.log.log import PartitionLog
from onceflow.log.manager import LogManager
from onceflow.log_limits import once_per_interval

if TYPE_CHECKING:
    from onceflow.cluster.zk import ZooKeeperCluster

log = logging.getLogger(__name__)
_repeated = once_per_interval(__name__)

FSYNC_THREADS = 4
# The longest pause between two attempts of a background task that keeps failing.
MAX_BACKOFF_S = 5.0
T = TypeVar("T")
# What a replica fetcher follows: its leader's endpoint, and each partition's leader epoch.
_Followed: TypeAlias = tuple[tuple[str, int], dict[tuple[str, int], int]]


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
        # One timer at the groups' next deadline, so that sessions and rebalances time out on time.
        self._group_timer: asyncio.TimerHandle | None = None
        self._group_timer_at_ms: int | None = None
        # The coordinators replay their logs here; how long each took is a metric.
        loading_started = time.monotonic()
        offsets_config = {
            **CONSUMER_OFFSETS_CONFIG,
            "segment.bytes": config.get("offsets.topic.segment.bytes"),
        }
        self.groups = GroupCoordinator(
            PartitionCoordinatorLog.open(self.logs, CONSUMER_OFFSETS_TOPIC, offsets_config),
            self.partition_exists,
            GroupConfig.from_kafka(config.props),
            now_ms(),
            self._schedule_group_timer,
        )
        self.coordinator_load_seconds = {"group": time.monotonic() - loading_started}
        loading_started = time.monotonic()
        txn_log_config = {
            **TRANSACTION_LOG_CONFIG,
            "segment.bytes": config.get("transaction.state.log.segment.bytes"),
        }
        self.transactions = TransactionCoordinator(
            PartitionCoordinatorLog.open(self.logs, TRANSACTION_LOG, txn_log_config),
            BrokerTransactionPartitions(
                self.logs,
                self.groups,
                ClusterMarkers(self) if self.cluster is not None else None,
                self.partition_exists,
            ),
            self.producer_ids.allocate,
            config.get_int("transaction.max.timeout.ms"),
            config.get_int("transactional.id.expiration.ms"),
        )
        self.coordinator_load_seconds["transaction"] = time.monotonic() - loading_started
        self._completions: dict[str, asyncio.Task[None]] = {}
        self.metrics = PrometheusMetrics(self) if metrics else Metrics()
        self.node_id = config.get_int("node.id")
        self.cluster_id = config.get("cluster.id")
        self.endpoint = Endpoint(self.node_id, "127.0.0.1", 0)
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
            self._fsync_threads, self.metrics.flushed, self._flush_ended, self._flush_failed
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
        # Cluster mode: the partitions this broker leads, a fetcher per leader it follows (with
        # what it follows there), the high watermarks it knows, and acks=all produces waiting.
        self._leading: dict[tuple[str, int], LeaderState] = {}
        self._cluster_topics: frozenset[str] = frozenset()  # in the last view
        self._fetchers: dict[int, tuple[_Followed, asyncio.Task[None]]] = {}
        self._isr_expansions: dict[tuple[str, int], asyncio.Task[bool]] = {}  # under way
        self._high_watermarks: dict[tuple[str, int], int] = {}
        # acks=all produces waiting for the high watermark, by the partitions they wait on: a
        # move of one partition's wakes only its own (before, every move woke every produce).
        self._replication_waiters: dict[DurableLog, set[asyncio.Future[float | None]]] = {}

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
        if inter_broker is not None:
            self.inter_broker = inter_broker
        self._flushes.start()
        self._tasks = self._background_tasks()
        self._fire_group_timers()  # sessions of members replayed from the log
        if self.cluster is None:
            self._complete_prepared()

    async def join_cluster(self) -> None:
        """In cluster mode, register with ZooKeeper (after `start`, which knows the endpoint)."""
        if self.cluster is not None:
            await self.cluster.join(self.endpoint.host, self.endpoint.port, self.listener_endpoints)
            await self.security.use_zookeeper(self.cluster.client)
            self._complete_prepared()  # its markers go to the leaders the view names
            self.producer_ids.ready()  # a first block of producer ids, asked for ahead of need

    def _complete_prepared(self) -> None:
        for transactional_id in self.transactions.pending_completions():
            self.complete_transaction(transactional_id)  # prepared before a crash

    async def stop(self) -> None:
        # Leave the cluster first, so that the others elect new leaders at once.
        if self.cluster is not None:
            cluster_tasks: list[asyncio.Task[Any]] = [fetcher for _, fetcher in self._fetchers.values()]
            cluster_tasks += self._isr_expansions.values()
            for task in cluster_tasks:
                task.cancel()
            await asyncio.gather(*cluster_tasks, return_exceptions=True)
            await self.security.close()
            await self.cluster.leave()
        # A transaction stopped half-way stays Prepare* in its log and completes at the next start.
        if self._group_timer is not None:
            self._group_timer.cancel()
        stopping = [*self._tasks, *self._completions.values()]
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
        """`work(*args)` on the record thread: pure work on bytes it was given, never the logs."""
        return asyncio.get_running_loop().run_in_executor(self._record_thread, work, *args)

    # -- transactions ----------------------------------------------------------
    def settle(self, reply: TxnReply[Any]) -> Awaitable[None]:
        """Do what a transaction coordinator's reply asks: start the phase two it names now;
        the awaitable ends when the client may have the reply."""
        completions = [self.complete_transaction(transactional_id) for transactional_id in reply.completions]
        return self._settled(reply.durable, completions if reply.answer_after_completion else [])

    async def _settled(self, durable: tuple[DurableLog, ...], completions: list[asyncio.Task[None]]) -> None:
        await self.wait_durable(durable)
        # A phase two that failed (a full disk) is logged and tried again by the sweep; the
        # transaction's outcome is durable already, and that is what the client is told.
        await asyncio.gather(*completions, return_exceptions=True)

    def complete_transaction(self, transactional_id: str) -> asyncio.Task[None]:
        """Phase two of a prepared transaction, once per transaction at a time."""
        task = self._completions.get(transactional_id)
        if task is None or task.done():
            task = asyncio.create_task(
                self._until_durable(self.transactions.complete(transactional_id, now_ms()))
            )
            self._completions[transactional_id] = task
            task.add_done_callback(lambda done: self._completion_done(transactional_id, done))
        return task

    def _completion_done(self, transactional_id: str, task: asyncio.Task[None]) -> None:
        self._completions.pop(transactional_id, None)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "completing transaction %r failed; it stays prepared until the next start",
                transactional_id,
                exc_info=task.exception(),
            )

    async def _until_durable(self, steps: Iterator[tuple[Awaited, ...]]) -> None:
        """Run a coordinator's steps, each once the logs the one before named are durable and
        its markers on other brokers written."""
        for step in steps:
            logs = [awaited for awaited in step if not isinstance(awaited, Awaitable)]
            markers = [awaited for awaited in step if isinstance(awaited, Awaitable)]
            self.appended(logs)
            await self.wait_durable(logs)
            # Cancelled with this phase two (the broker stops), they stop too.
            await asyncio.gather(*markers)

    def _sweep_transactions(self) -> None:
        """Abort transactions past their timeout (fencing their producer), finish prepared ones
        and expire idle ids."""
        self.transactions.abort_timed_out(now_ms())
        # Newly timed out, and any whose completion failed (a full disk, say): retry.
        for transactional_id in self.transactions.pending_completions():
            self.complete_transaction(transactional_id)
        self.transactions.expire_idle_ids(now_ms())

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
        for key in [key for key in self._leading if key[0] == topic]:
            del self._leading[key]
        for key in [key for key in self._high_watermarks if key[0] == topic]:
            del self._high_watermarks[key]
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
        """Lead what the view says this broker leads, and follow the rest. A new leader starts
        its epoch at its log end (in the leader-epoch checkpoint), which is where followers
        that hold more cut their logs (`broker.replication`)."""
        leading: dict[tuple[str, int], LeaderState] = {}
        following: dict[int, dict[tuple[str, int], int]] = {}  # leader -> partition -> its epoch
        followed_logs: dict[tuple[str, int], PartitionLog] = {}
        for topic, assignment in view.topics.items():
            for partition, replicas in enumerate(assignment.replicas):
                state = view.states.get((topic, partition))
                if self.node_id not in replicas or state is None:
                    continue
                key = (topic, partition)
                if state.leader == self.node_id:
                    current = self._leading.get(key)
                    partition_log = self.logs.get(*key)
                    if current is None or current.leader_epoch != state.leader_epoch:
                        current = LeaderState(state.leader_epoch, now_ms())
                        if partition_log is not None:
                            partition_log.assign_leader_epoch(state.leader_epoch)
                            current.epoch_start_offset = partition_log.epoch_start_offset(state.leader_epoch)
                    leading[key] = current
                elif state.leader in view.brokers and (partition_log := self.logs.get(*key)) is not None:
                    following.setdefault(state.leader, {})[key] = state.leader_epoch
                    followed_logs[key] = partition_log
        self._leading = leading
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
                FollowedPartition(*key, followed_logs[key], epoch, self._high_watermarks.get(key, 0))
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

    def _follower_appended(self, topic: str, partition: int, partition_log: PartitionLog, hw: int) -> None:
        self._high_watermarks[topic, partition] = hw
        self.appended([partition_log])

    def is_replica(self, topic: str, partition: int, broker_id: int) -> bool:
        """Whether `broker_id` is assigned a replica of the partition (cluster mode)."""
        assert self.cluster is not None
        assignment = self.cluster.view.topics.get(topic)
        return assignment is not None and broker_id in assignment.replicas[partition]

    def follower_fetched(self, topic: str, partition: int, replica_id: int, fetch_offset: int) -> None:
        """A follower fetched at `fetch_offset`: that is its log end now."""
        assert self.cluster is not None
        view = self.cluster.view
        state = self._leading.get((topic, partition))
        partition_log = self.logs.get(topic, partition)
        if state is None or partition_log is None or replica_id not in view.topics[topic].replicas[partition]:
            return  # not the leader (any more), or not a replica of the partition
        key = (topic, partition)
        moved = state.log_end.get(replica_id) != fetch_offset
        before = self.high_watermark(topic, partition, partition_log)
        state.fetched(replica_id, fetch_offset, partition_log.log_end_offset, now_ms())
        # Only a moved high watermark wakes anyone: a long-polling follower re-reads (and so
        # comes here) on every wake-up, and waking the others each time would make them spin.
        if moved and self.high_watermark(topic, partition, partition_log) > before:
            self._wake_fetches([partition_log])  # consumers at the high watermark, and acks=all produces
        isr = view.isr(topic, partition)
        # Caught up to the high watermark and into this leader's epoch (KAFKA-7128): a new
        # leader's high watermark may lag what its predecessor acknowledged, and a replica
        # below the epoch's start could be elected without those records.
        if (
            replica_id not in isr
            and key not in self._isr_expansions
            and fetch_offset
            >= max(self.high_watermark(topic, partition, partition_log), state.epoch_start_offset)
        ):
            state.caught_up_ms[replica_id] = now_ms()  # not lagging the moment it is back
            task = asyncio.create_task(self.cluster.change_isr(topic, partition, (*isr, replica_id)))
            self._isr_expansions[key] = task
            task.add_done_callback(partial(self._isr_expansion_done, key))

    def _isr_expansion_done(self, key: tuple[str, int], task: asyncio.Task[bool]) -> None:
        self._isr_expansions.pop(key, None)
        if not task.cancelled() and task.exception() is None and task.result():
            self.metrics.isr_changed(shrunk=False)

    def high_watermark(self, topic: str, partition: int, partition_log: PartitionLog) -> int:
        """What consumers may read: the flushed offset alone; in a cluster, on the leader, also
        no further than every ISR member's log end (never moving back)."""
        if self.cluster is None:
            return partition_log.flushed_offset
        key = (topic, partition)
        state = self._leading.get(key)
        isr = self.cluster.view.isr(topic, partition)
        known = min(self._high_watermarks.get(key, 0), partition_log.flushed_offset)
        if state is None:
            return partition_log.flushed_offset if not isr else known
        ends = [state.log_end.get(replica) for replica in isr if replica != self.node_id]
        if None in ends:
            return known
        hw = max(known, min([partition_log.flushed_offset, *(end for end in ends if end is not None)]))
        self._high_watermarks[key] = hw
        return hw

    def replica_states(self) -> list[ReplicaState]:
        """Every partition this broker holds, as its metrics read it: whether it leads it, the
        high watermark (the ISR's, `high_watermark`), and its replicas and ISR. The coordinators'
        logs, not replicated, count as led by the coordinator's broker alone."""
        states = []
        view = None if self.cluster is None else self.cluster.view
        for topic, partition, partition_log in self.logs.partitions():
            hw = self.high_watermark(topic, partition, partition_log)
            min_insync = self.min_insync_replicas(topic)
            assignment = None if view is None else view.topics.get(topic)
            if view is None or assignment is None or partition >= len(assignment.replicas):
                leader = view is None or self.coordinates_transactions
                states.append(ReplicaState(topic, partition, partition_log, leader, hw, 1, 1, min_insync))
                continue
            replicas, in_sync = len(assignment.replicas[partition]), len(view.isr(topic, partition))
            leader = (topic, partition) in self._leading
            states.append(
                ReplicaState(topic, partition, partition_log, leader, hw, replicas, in_sync, min_insync)
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

    def leading(self) -> set[tuple[str, int]]:
        """The partitions this broker leads (cluster mode)."""
        return set(self._leading)

    def leader_epoch(self, topic: str, partition: int) -> int | None:
        """The epoch this broker leads the partition in, if it does."""
        state = self._leading.get((topic, partition))
        return None if state is None else state.leader_epoch

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
                (topic, partition)
                for topic, partition, partition_log, _ in targets
                if (topic, partition) in self._leading and self.logs.get(topic, partition) is partition_log
            }
            done = {
                (topic, partition): self.high_watermark(topic, partition, partition_log) >= end
                for topic, partition, partition_log, end in targets
            }
            remaining = deadline - time.monotonic()
            if all(done.values()) or len(held) < len(done) or remaining <= 0:
                return {key: self._replicated(key, reached, key in held) for key, reached in done.items()}
            short = [
                partition_log for topic, partition, partition_log, _ in targets if not done[topic, partition]
            ]
            waiter: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
            for partition_log in short:
                self._replication_waiters.setdefault(partition_log, set()).add(waiter)
            try:
                await _woken_or_timed_out(waiter, remaining)
            finally:
                _forget(self._replication_waiters, short, waiter)

    def _replicated(self, key: tuple[str, int], reached: bool, held: bool) -> ErrorCode:
        if not held:
            return ErrorCode.not_leader_or_follower
        if not reached:
            return ErrorCode.request_timed_out
        if self.in_sync_replicas(*key) < self.min_insync_replicas(key[0]):
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    def _wake_everyone(self) -> None:
        """Leadership or an ISR changed, which may move any high watermark (or end a wait for
        one): every acks=all produce and every long-polling fetch looks again (a follower's too:
        a partition this broker no longer leads answers its error at once)."""
        self._wake_fetches([*self._replication_waiters, *self._fetch_waiters])
        if self._append_waiters:
            _wake(self._append_waiters, list(self._append_waiters), time.perf_counter())

    async def _shrink_isrs(self) -> None:
        """As Kafka's leaders: drop followers that have not caught up for replica.lag.time.max.ms
        from the ISR (a compare-and-set on the state znode, keeping the leader epoch)."""
        assert self.cluster is not None
        lag_ms = self.config.get_int("replica.lag.time.max.ms")
        view = self.cluster.view
        for (topic, partition), state in list(self._leading.items()):
            isr = view.isr(topic, partition)
            lagging = state.lagging(isr, self.node_id, lag_ms, now_ms())
            if lagging:
                in_sync = tuple(replica for replica in isr if replica not in lagging)
                log.warning("%s-%d: %s lag, ISR now %s", topic, partition, lagging, in_sync)
                if await self.cluster.change_isr(topic, partition, in_sync):
                    self.metrics.isr_changed(shrunk=True)

    @property
    def coordinates_transactions(self) -> bool:
        """Whether this broker's transaction coordinator is the one clients find (FindCoordinator)."""
        return self.cluster is None or self.cluster.view.coordinator_id == self.node_id

    def leader_elsewhere(self, topic: str, partition: int) -> bool:
        """In a cluster: the partition exists and another broker leads it, or none does."""
        if self.cluster is None:
            return False
        view = self.cluster.view
        assignment = view.topics.get(topic)
        return (
            assignment is not None
            and 0 <= partition < len(assignment.replicas)
            and view.leader(topic, partition) != self.node_id
        )

    def current_leader(self, topic: str, partition: int) -> dict[str, int] | None:
        """In a cluster: the partition's leader and epoch as NOT_LEADER_OR_FOLLOWER answers name
        them (KIP-951), so that a client goes there without a Metadata request first."""
        if self.cluster is None:
            return None
        view = self.cluster.view
        state = view.states.get((topic, partition))
        if state is None:
            return None
        return {"leader_id": view.live_leader(topic, partition), "leader_epoch": state.leader_epoch}

    def known_endpoints(self) -> list[Endpoint]:
        """This broker, and in a cluster every live broker registered in ZooKeeper."""
        if self.cluster is None:
            return [self.endpoint]
        brokers = self.cluster.view.brokers.values()
        return [Endpoint(node.broker_id, node.host, node.port) for node in brokers]

    def partition_exists(self, partition: tuple[str, int]) -> bool:
        """Whether the partition exists: in a cluster, anywhere in it (this broker may hold no
        replica of a topic whose offsets its group coordinator keeps)."""
        if self.cluster is None:
            return self.logs.get(*partition) is not None
        assignment = self.cluster.view.topics.get(partition[0])
        return assignment is not None and 0 <= partition[1] < len(assignment.replicas)

    def min_insync_replicas(self, topic: str) -> int:
        """The topic's `min.insync.replicas`, else the broker's."""
        configs = self.logs.topics[topic].configs
        return int(configs.get("min.insync.replicas", self.config.get("min.insync.replicas")))

    def in_sync_replicas(self, topic: str, partition: int) -> int:
        """How many replicas are in the partition's ISR: this broker alone outside a cluster."""
        if self.cluster is None:
            return 1
        return len(self.cluster.view.isr(topic, partition))

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
        self.appended(self.groups.tick(now_ms()))
        next_at_ms = self.groups.next_deadline_ms()
        if next_at_ms is not None:
            self._schedule_group_timer(next_at_ms)

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
        produces (cluster mode) waiting on them."""
        woken_at = time.perf_counter()
        if self._replication_waiters:
            _wake(self._replication_waiters, logs, woken_at)
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


def high_watermark(log: PartitionLog) -> int:
    return log.flushed_offset


def _run_each(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()
