"""The kazoo shell: registers the broker, keeps its view of the cluster, and, on the broker that
holds /controller, runs the controller's state machine and makes its writes.

Every watch that fires (brokers, controller, topics, topic configs, partition states) asks for
one new read of all the znodes, on a worker thread; reads are coalesced, so a burst of changes
costs one read.
This is simple and fine for tens of topics; Kafka's controller keeps finer-grained caches.
Brokers learn their roles by watching the state znodes, where Kafka's controller sends them
LeaderAndIsr requests.

Controller writes go in a ZooKeeper transaction with a check of /controller_epoch's version, so
a controller that was replaced cannot write any more (Kafka's `checkControllerEpoch`). A
partition's leader writes its state too, when it drops lagging followers from the ISR, with a
compare-and-set on the version it last read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from onceflow.cluster.controller import (
    CREATE,
    ControllerStateMachine,
    Election,
    ElectionRefused,
    Replicas,
    StateWrite,
)
from onceflow.cluster.errors import (
    AssignmentChangedError,
    BrokerIdTakenError,
    ClusterError,
    PartitionCountError,
    TopicExistsError,
)
from onceflow.cluster.view import ClusterView
from onceflow.cluster.znodes import (
    BROKER_IDS,
    CONTROLLER,
    CONTROLLER_EPOCH,
    DELETE_TOPICS,
    NO_LEADER,
    PRODUCER_ID_BLOCK,
    TOPIC_CONFIGS,
    TOPICS,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    broker_path,
    decode_controller,
    decode_producer_id_block_end,
    decode_topic_config,
    delete_topic_path,
    encode_controller,
    encode_producer_id_block,
    encode_topic_config,
    partition_state_path,
    topic_config_path,
    topic_path,
)

log = logging.getLogger(__name__)

RETRY_AFTER_ERROR_S = 0.2
ELECTION_ATTEMPTS = 3  # a state written by someone else meanwhile: read again and retry


class ZooKeeperCluster:
    def __init__(
        self,
        connect: str,
        broker_id: int,
        session_timeout_ms: int,
        connection_timeout_ms: int,
        unclean_leader_election: bool,
        on_view: Callable[[ClusterView], None],
    ) -> None:
        """`on_view` runs on the event loop with every new view, before anyone else sees it."""
        self.connect = connect
        self.broker_id = broker_id
        self.view = ClusterView()
        # How long joining waits: for the connection, then for this broker's registration.
        self._timeout_s = connection_timeout_ms / 1000
        self._session_timeout_s = session_timeout_ms / 1000
        self._client = KazooClient(hosts=connect, timeout=self._session_timeout_s)
        self._unclean_default = unclean_leader_election
        self._on_view = on_view
        self._registration: BrokerRegistration | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._session_lost = False
        self._waiters: list[tuple[Callable[[ClusterView], bool], asyncio.Future[None]]] = []
        self._follower: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        # Only touched on a worker thread holding the lock: the reads and writes that follow the
        # cluster, and the elections ElectLeaders asks for.
        self._controller_lock = threading.Lock()
        self._creating: set[str] = set()  # topics being created in the background
        # Only touched on the worker thread that reads and writes, one read at a time.
        self._controller: ControllerStateMachine | None = None
        self._controller_epoch_version = -1
        self._topic_configs: Mapping[str, Mapping[str, str]] = {}

    @property
    def client(self) -> KazooClient:
        """The ZooKeeper session (started by `join`), which `cluster.security_zk` shares."""
        return self._client

    # -- lifecycle ---------------------------------------------------------------------------
    async def join(
        self, host: str, port: int, endpoints: Mapping[str, tuple[str, int]] | None = None
    ) -> None:
        """Register this broker (an ephemeral /brokers/ids/N) and wait for the first view;
        `host` and `port` are its inter-broker listener's, `endpoints` every listener's."""
        self._loop = asyncio.get_running_loop()
        # kazoo warns of every failed attempt to connect; an unreachable ZooKeeper is one line.
        with _KazooWarnings() as warnings:
            try:
                await asyncio.to_thread(self._client.start, self._timeout_s)
            except KazooTimeoutError as error:
                await asyncio.to_thread(self._close)
                why = f" ({warnings.last})" if warnings.last else ""
                raise ClusterError(
                    f"cannot reach ZooKeeper at {self.connect} within {self._timeout_s:g} s{why}"
                ) from error
        self._registration = BrokerRegistration(self.broker_id, host, port, dict(endpoints or {}))
        try:
            # A killed broker's session, and its registration, last a session timeout (ZooKeeper
            # ends it within about that): a broker started again at once waits for it, as Kafka's.
            await asyncio.to_thread(self._register_once_free, 2 * self._session_timeout_s)
        except BaseException:
            await asyncio.to_thread(self._close)
            raise
        self._client.add_listener(self._session_state_changed)
        self._follower = asyncio.create_task(self._follow(), name="cluster-follower")
        self._changed.set()
        if not await self.wait_for(lambda view: self.broker_id in view.brokers, self._timeout_s):
            raise ClusterError(f"broker {self.broker_id} did not see its own registration in time")

    async def leave(self) -> None:
        """Close the session: the ephemeral znodes go at once, so the others take over now."""
        tasks = [task for task in (self._follower, *self._background) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self._client.stop()
        self._client.close()

    def _register_once_free(self, wait_s: float) -> None:
        """`_register`, waiting up to `wait_s` for another session's registration of this id
        to go."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._register()
                return
            except NoNodeError:
                continue  # the other registration went between our create and our look at it
            except BrokerIdTakenError:
                gone = threading.Event()
                if self._client.exists(broker_path(self.broker_id), watch=_setter(gone)) is None:
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                log.warning(
                    "broker id %d is registered by another session, as a broker killed a moment"
                    " ago leaves it: waiting up to %.1f s for it to end",
                    self.broker_id,
                    remaining,
                )
                if not gone.wait(remaining):
                    raise

    def _register(self) -> None:
        assert self._registration is not None
        for path in (BROKER_IDS, TOPICS, TOPIC_CONFIGS, DELETE_TOPICS):
            self._client.ensure_path(path)
        path = broker_path(self.broker_id)
        try:
            self._client.create(path, self._registration.encode(), ephemeral=True)
        except NodeExistsError:
            _, stat = self._client.get(path)
            if stat.ephemeralOwner != self._client.client_id[0]:
                raise BrokerIdTakenError(
                    f"broker id {self.broker_id} is registered by another live broker "
                    f"(or one killed less than a session timeout ago)"
                ) from None

    def _session_state_changed(self, state: str) -> None:
        """On kazoo's thread. A lost session took our ephemeral znodes: register again once
        connected."""
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED:
            self._mark_changed()

    def _mark_changed(self, _event: Any = None) -> None:
        """A watch fired (on kazoo's thread): read everything again soon."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._changed.set)

    # -- following the cluster ---------------------------------------------------------------
    async def _follow(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                view, again = await asyncio.to_thread(self._read_and_act)
            except (KazooException, KazooTimeoutError, ClusterError) as error:
                log.warning("reading the cluster's znodes failed (%s); trying again", reason(error))
                await asyncio.sleep(RETRY_AFTER_ERROR_S)
                self._changed.set()
                continue
            self.view = view
            self._on_view(view)
            self._wake_waiters()
            if again:
                self._changed.set()

    def _wake_waiters(self) -> None:
        still = []
        for predicate, waiter in self._waiters:
            if waiter.done():
                continue
            if predicate(self.view):
                waiter.set_result(None)
            else:
                still.append((predicate, waiter))
        self._waiters = still

    async def wait_for(self, predicate: Callable[[ClusterView], bool], timeout_s: float) -> bool:
        """Whether the view came to satisfy `predicate` within the timeout."""
        if predicate(self.view):
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, waiter))
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return False
        return True

    def _read_and_act(self) -> tuple[ClusterView, bool]:
        """On a worker thread: read every znode (setting watches), then, on the controller, make
        the controller's writes. Returns the view and whether to read again at once."""
        with self._controller_lock:
            if self._session_lost:
                self._session_lost = False
                self._controller = None
                self._register()
            view = self._read()
            if view.controller_id != self.broker_id:
                self._controller = None
                return view, False
            return view, self._act_as_controller(view)

    def _read(self) -> ClusterView:
        return read_view(self._client, self._mark_changed, self._controller_znodes)

    def _controller_znodes(self) -> tuple[int, int]:
        """The controller's id and epoch; when there is none, try to become it (an ephemeral
        znode: the first broker to create it wins, the others watch it)."""
        client = self._client
        for _ in range(2):
            try:
                data, _ = client.get(CONTROLLER, watch=self._mark_changed)
            except NoNodeError:
                try:
                    client.create(CONTROLLER, encode_controller(self.broker_id), ephemeral=True)
                    log.info("broker %d is the controller", self.broker_id)
                except NodeExistsError:
                    pass
                continue
            try:
                controller_id = decode_controller(data)
            except ValueError as error:
                raise ClusterError(f"bad {CONTROLLER} znode: {error}") from error
            try:
                epoch = int(client.get(CONTROLLER_EPOCH)[0])
            except NoNodeError:
                epoch = 0
            return controller_id, epoch
        return NO_LEADER, 0

    # -- the controller ----------------------------------------------------------------------
    def _act_as_controller(self, view: ClusterView) -> bool:
        """Feed what changed since the last view to the state machine and write what it says.
        A failed write means someone else wrote: start again from a fresh read."""
        machine = self._controller
        writes: list[StateWrite] = []
        self._topic_configs = view.topic_configs
        if machine is None:
            epoch, self._controller_epoch_version = self._bump_controller_epoch()
            machine = ControllerStateMachine(
                epoch,
                view.brokers,
                {topic: assignment.replicas for topic, assignment in view.topics.items()},
                {key: (state, view.state_versions[key]) for key, state in view.states.items()},
                self._unclean_allowed,
            )
            self._controller = machine
            writes += machine.became_controller()
        else:
            for key, state in view.states.items():
                cached = machine.states.get(key)
                if cached is None or cached[1] != view.state_versions[key]:
                    machine.state_changed(*key, state, view.state_versions[key])
            for broker_id in sorted(machine.live - set(view.brokers)):
                writes += machine.broker_down(broker_id)
            for broker_id in sorted(set(view.brokers) - machine.live):
                writes += machine.broker_up(broker_id)
            for topic in sorted(set(view.topics) - view.topics_to_delete):
                replicas = view.topics[topic].replicas
                if len(replicas) != len(machine.assignments.get(topic, ())):  # new, or new partitions
                    writes += machine.topic_created(topic, replicas)
        for topic in sorted(view.topics_to_delete):
            machine.topic_deleted(topic)
        writes = [write for write in writes if write.topic not in view.topics_to_delete]
        for write in writes:
            if not self._write_state(write):
                self._controller = None
                return True
        for topic in sorted(view.topics_to_delete):
            self._delete_topic_znodes(topic)
        return bool(view.topics_to_delete)

    def _delete_topic_znodes(self, topic: str) -> None:
        """The topic's znodes, then its marker: the brokers delete their replicas when the topic
        leaves their view. A controller that dies half-way leaves the marker to its successor."""
        for path in (topic_path(topic), topic_config_path(topic), delete_topic_path(topic)):
            with contextlib.suppress(NoNodeError):  # deleted before a controller failover
                self._client.delete(path, recursive=True)
        log.info("deleted topic %r", topic)

    def _unclean_allowed(self, topic: str) -> bool:
        """The topic's unclean.leader.election.enable, else the broker's."""
        value = self._topic_configs.get(topic, {}).get("unclean.leader.election.enable")
        return self._unclean_default if value is None else value.lower() == "true"

    def _bump_controller_epoch(self) -> tuple[int, int]:
        """A new controller's epoch and the znode version that fences its writes."""
        client = self._client
        try:
            data, stat = client.get(CONTROLLER_EPOCH)
        except NoNodeError:
            client.create(CONTROLLER_EPOCH, b"1")
            return 1, 0
        epoch = int(data) + 1
        new_stat = client.set(CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version)
        return epoch, new_stat.version

    def _write_state(self, write: StateWrite) -> bool:
        path = partition_state_path(write.topic, write.partition)
        if write.expected_version == CREATE:
            self._client.ensure_path(path.rsplit("/", 1)[0])
        transaction = self._client.transaction()
        transaction.check(CONTROLLER_EPOCH, self._controller_epoch_version)
        if write.expected_version == CREATE:
            transaction.create(path, write.state.encode())
        else:
            transaction.set_data(path, write.state.encode(), version=write.expected_version)
        failures = [result for result in transaction.commit() if isinstance(result, Exception)]
        if failures:
            log.warning("writing %s failed (%s); reading the cluster again", path, reason(failures[0]))
            return False
        log.info("%s-%d: %s", write.topic, write.partition, write.state)
        return True

    # -- elections asked for ------------------------------------------------------------------
    async def elect_leaders(
        self, partitions: list[tuple[str, int]] | None, election: Election, timeout_s: float
    ) -> dict[tuple[str, int], int | ElectionRefused] | None:
        """ElectLeaders on the controller: each partition's new leader, or why it has none (every
        partition when `partitions` is None), once this broker's view shows the new leaders or
        the timeout passed; None when this broker is not the controller."""
        try:
            outcomes = await asyncio.to_thread(self._elect, partitions, election)
        except (KazooException, KazooTimeoutError) as error:
            raise ClusterError(f"electing leaders failed: {reason(error)}") from error
        if outcomes is None:
            return None
        elected = {key: leader for key, leader in outcomes.items() if isinstance(leader, int)}
        self._mark_changed()
        await self.wait_for(
            lambda view: all(view.leader(*key) == leader for key, leader in elected.items()), timeout_s
        )
        return outcomes

    def _elect(
        self, partitions: list[tuple[str, int]] | None, election: Election
    ) -> dict[tuple[str, int], int | ElectionRefused] | None:
        with self._controller_lock:
            for _ in range(ELECTION_ATTEMPTS):
                if self._controller is None:
                    view = self._read()
                    if view.controller_id != self.broker_id:
                        return None
                    self._act_as_controller(view)  # a new state machine, from what ZooKeeper holds
                    if self._controller is None:
                        continue
                writes, outcomes = self._controller.elect(partitions, election)
                if all(self._write_state(write) for write in writes):
                    return outcomes
                self._controller = None
        raise ClusterError("the partitions' states kept changing during the election; ask again")

    # -- a leader's ISR changes --------------------------------------------------------------
    async def change_isr(self, topic: str, partition: int, isr: tuple[int, ...]) -> bool:
        """The leader's ISR change: a compare-and-set on the state znode this broker last read,
        keeping the leader and its epoch (as Kafka's leaders in ZooKeeper mode). False when
        someone wrote first; the next view shows what they wrote."""
        key = (topic, partition)
        state, version = self.view.states.get(key), self.view.state_versions.get(key)
        if state is None or version is None or state.leader != self.broker_id:
            return False
        new_state = PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch)
        path = partition_state_path(topic, partition)
        try:
            await asyncio.to_thread(self._client.set, path, new_state.encode(), version)
        except (KazooException, KazooTimeoutError) as error:
            log.warning("changing the ISR of %s-%d failed (%s)", topic, partition, reason(error))
            return False
        return True

    # -- producer ids ------------------------------------------------------------------------
    def reserve_producer_ids(self, size: int) -> int:
        """The first of `size` producer ids no other broker gets: a compare-and-set on
        /latest_producer_id_block, as Kafka's ZooKeeper mode. It blocks the caller for a round
        trip to ZooKeeper, once per block."""
        client = self._client
        while True:
            try:
                data, stat = client.get(PRODUCER_ID_BLOCK)
            except NoNodeError:
                first, version = 0, CREATE
            else:
                first, version = decode_producer_id_block_end(data) + 1, stat.version
            block = encode_producer_id_block(self.broker_id, first, first + size - 1)
            try:
                if version == CREATE:
                    client.create(PRODUCER_ID_BLOCK, block)
                else:
                    client.set(PRODUCER_ID_BLOCK, block, version=version)
            except (NodeExistsError, BadVersionError):
                continue  # another broker took a block first
            return first

    # -- topics ------------------------------------------------------------------------------
    async def create_topic(
        self, topic: str, replicas: tuple[Replicas, ...], configs: Mapping[str, str]
    ) -> uuid.UUID:
        """Write the topic's configs and assignment; the controller then elects its leaders."""
        assignment = TopicAssignment(uuid.uuid4(), replicas)
        # A lost connection leaves the write unknown: it is sent again (as Kafka's ZooKeeper
        # client resends) until the session is back, and a topic found with our own id is ours.
        retry = KazooRetry(max_tries=-1, max_delay=1.0, deadline=self._session_timeout_s * 3)
        try:
            await asyncio.to_thread(retry, self._create_topic, topic, assignment, configs)
        except (KazooException, KazooTimeoutError) as error:
            raise ClusterError(f"writing topic {topic!r} to ZooKeeper failed: {reason(error)}") from error
        return assignment.topic_id

    def _create_topic(self, topic: str, assignment: TopicAssignment, configs: Mapping[str, str]) -> None:
        transaction = self._client.transaction()
        transaction.create(topic_config_path(topic), encode_topic_config(configs))
        transaction.create(topic_path(topic), assignment.encode())
        results = transaction.commit()
        if any(isinstance(result, NodeExistsError) for result in results):
            if self.topic_id(topic) == assignment.topic_id:
                return  # an earlier attempt's write, its answer lost with the connection
            raise TopicExistsError(f"topic {topic!r} already exists")
        for result in results:
            if isinstance(result, Exception):
                raise result

    def topic_id(self, topic: str) -> uuid.UUID | None:
        """The id ZooKeeper holds for `topic` (None: no such topic). A round trip: blocks."""
        try:
            data, _ = self._client.get(topic_path(topic))
        except NoNodeError:
            return None
        return TopicAssignment.decode(data).topic_id

    async def add_partitions(self, topic: str, assignment: TopicAssignment) -> None:
        """Replace the topic's assignment by one with more partitions, a compare-and-set on the
        one `assignment` extends; the controller then elects the new partitions' leaders."""
        try:
            await asyncio.to_thread(self._add_partitions, topic, assignment)
        except NoNodeError:
            raise AssignmentChangedError(f"topic '{topic}' was deleted meanwhile") from None
        except (KazooException, KazooTimeoutError) as error:
            raise ClusterError(f"writing the partitions of {topic!r} to ZooKeeper failed: {error}") from error

    def _add_partitions(self, topic: str, assignment: TopicAssignment) -> None:
        data, stat = self._client.get(topic_path(topic))
        current = TopicAssignment.decode(data)
        if len(current.replicas) >= len(assignment.replicas):  # this broker's view was behind
            raise PartitionCountError(
                f"topic '{topic}' has {len(current.replicas)} partitions; the count can only grow"
            )
        extended = current.topic_id == assignment.topic_id and assignment.replicas[
            : len(current.replicas)
        ] == (current.replicas)
        if not extended:
            raise AssignmentChangedError(f"topic '{topic}' changed meanwhile; ask again")
        try:
            self._client.set(topic_path(topic), assignment.encode(), version=stat.version)
        except BadVersionError:
            raise AssignmentChangedError(f"topic '{topic}' changed meanwhile; ask again") from None

    async def delete_topic(self, topic: str, timeout_s: float) -> bool:
        """Mark the topic for deletion, as Kafka's AdminZkClient does, and wait until the
        controller has deleted it: False if that takes longer than `timeout_s`."""
        try:
            await asyncio.to_thread(self._client.ensure_path, delete_topic_path(topic))
        except (KazooException, KazooTimeoutError) as error:
            raise ClusterError(f"marking {topic!r} for deletion in ZooKeeper failed: {error}") from error
        return await self.wait_for(lambda view: topic not in view.topics, timeout_s)

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str]) -> None:
        """Replace the topic's configs in its znode (every broker watches it and applies them)."""
        try:
            await asyncio.to_thread(self._set_topic_configs, topic, configs)
        except (KazooException, KazooTimeoutError) as error:
            raise ClusterError(f"writing the configs of {topic!r} to ZooKeeper failed: {error}") from error

    def _set_topic_configs(self, topic: str, configs: Mapping[str, str]) -> None:
        """A compare-and-set on the version just read, creating the znode if it is missing, as
        Kafka's AdminZkClient; a concurrent writer makes it read and write again (the last
        complete write wins, as in Kafka)."""
        path, data = topic_config_path(topic), encode_topic_config(configs)
        while True:
            try:
                _, stat = self._client.get(path)
            except NoNodeError:
                try:
                    self._client.create(path, data)
                except NodeExistsError:
                    continue
                return
            try:
                self._client.set(path, data, version=stat.version)
            except (BadVersionError, NoNodeError):
                continue
            return

    def create_topic_soon(
        self, topic: str, replicas: tuple[Replicas, ...], configs: Mapping[str, str] | None = None
    ) -> None:
        """Auto-creation (and the coordinators' internal topics): Metadata answers
        LEADER_NOT_AVAILABLE meanwhile, FindCoordinator COORDINATOR_NOT_AVAILABLE, and clients
        ask again. One creation of a topic at a time."""
        if topic in self._creating:
            return
        self._creating.add(topic)
        task = asyncio.create_task(self._create_quietly(topic, replicas, configs or {}))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda _: self._creating.discard(topic))

    async def _create_quietly(
        self, topic: str, replicas: tuple[Replicas, ...], configs: Mapping[str, str]
    ) -> None:
        try:
            await self.create_topic(topic, replicas, configs)
        except TopicExistsError:
            pass  # another broker created it first
        except (KazooException, KazooTimeoutError):
            log.exception("auto-creating topic %r failed", topic)

    async def wait_for_leaders(self, topic: str, timeout_s: float, partitions: int = 1) -> bool:
        """Until this broker's view has at least `partitions` partitions of the topic, all led."""

        def led(view: ClusterView) -> bool:
            assignment = view.topics.get(topic)
            return (
                assignment is not None
                and len(assignment.replicas) >= partitions
                and all(
                    view.leader(topic, partition) != NO_LEADER
                    for partition in range(len(assignment.replicas))
                )
            )

        return await self.wait_for(led, timeout_s)


def _topic_config(client: KazooClient, topic: str, watch: Callable[[Any], None] | None) -> dict[str, str]:
    path = topic_config_path(topic)
    for _ in range(2):
        try:
            return decode_topic_config(client.get(path, watch=watch)[0])
        except NoNodeError:
            # Watch for its creation; if it was just created, read it after all.
            if client.exists(path, watch=watch) is None:
                break
    return {}


def read_view(
    client: KazooClient, watch: Callable[[Any], None] | None, controller: Callable[[], tuple[int, int]]
) -> ClusterView:
    """Every znode of the cluster, setting `watch` on what can change; `controller()` gives the
    controller's id and epoch (a broker races to become it when there is none)."""
    brokers = {}
    for child in client.get_children(BROKER_IDS, watch=watch):
        try:
            broker_id = int(child)
            data, _ = client.get(broker_path(broker_id))
            brokers[broker_id] = BrokerRegistration.decode(broker_id, data)
        except NoNodeError:
            continue  # gone since the listing
        except ValueError as error:
            log.error("ignoring broker znode %s: %s", child, error)
    controller_id, controller_epoch = controller()
    topics: dict[str, TopicAssignment] = {}
    configs: dict[str, Mapping[str, str]] = {}
    states: dict[tuple[str, int], PartitionState] = {}
    versions: dict[tuple[str, int], int] = {}
    for topic in client.get_children(TOPICS, watch=watch):
        try:
            # Watched: CreatePartitions changes it.
            topics[topic] = TopicAssignment.decode(client.get(topic_path(topic), watch=watch)[0])
            configs[topic] = _topic_config(client, topic, watch)
        except NoNodeError:
            continue
        except ValueError as error:
            log.error("ignoring topic znode %s: %s", topic, error)
            continue
        for partition in range(len(topics[topic].replicas)):
            path = partition_state_path(topic, partition)
            try:
                data, stat = client.get(path, watch=watch)
            except NoNodeError:
                # Watch for the controller to create it; if it just did, read it after all.
                if client.exists(path, watch=watch) is None:
                    continue
                try:
                    data, stat = client.get(path, watch=watch)
                except NoNodeError:
                    continue
            try:
                states[topic, partition] = PartitionState.decode(data)
                versions[topic, partition] = stat.version
            except ValueError as error:
                log.error("ignoring partition state %s: %s", path, error)
    try:
        to_delete = frozenset(client.get_children(DELETE_TOPICS, watch=watch))
    except NoNodeError:  # a cluster no broker has joined yet
        to_delete = frozenset()
    return ClusterView(brokers, controller_id, controller_epoch, topics, states, configs, versions, to_delete)


def read_cluster(connect: str, timeout_s: float) -> ClusterView:
    """One read of a cluster's znodes from outside it (`onceflow cluster status`): no watches,
    no registration, and no race for the controller."""
    client = KazooClient(hosts=connect, timeout=timeout_s, read_only=True)
    try:
        client.start(timeout_s)
        return read_view(client, None, lambda: _read_controller(client))
    except KazooTimeoutError as error:
        raise ClusterError(f"cannot reach ZooKeeper at {connect}") from error
    except NoNodeError as error:
        raise ClusterError(f"no onceflow cluster in ZooKeeper at {connect}") from error
    except KazooException as error:  # the connection lost during the read, the session expired
        raise ClusterError(f"ZooKeeper at {connect} failed the read: {type(error).__name__}") from error
    finally:
        client.stop()
        client.close()


def _read_controller(client: KazooClient) -> tuple[int, int]:
    try:
        controller_id = decode_controller(client.get(CONTROLLER)[0])
    except NoNodeError:
        return NO_LEADER, 0
    except ValueError as error:
        raise ClusterError(f"bad {CONTROLLER} znode: {error}") from error
    try:
        return controller_id, int(client.get(CONTROLLER_EPOCH)[0])
    except NoNodeError:
        return controller_id, 0


def reason(error: BaseException) -> str:
    """What an error says, for a log line: kazoo's errors mostly carry no message."""
    if isinstance(error, BadVersionError):
        return "the znode changed since this broker read it"
    if isinstance(error, NoNodeError):
        return "the znode is gone"
    return str(error) or type(error).__name__


class _KazooWarnings(logging.Handler):
    """While in use, kazoo's log records are kept instead of printed; `last` is the last
    warning's reason (its message after "Connection dropped: ")."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last = ""
        self._logger = logging.getLogger("kazoo")

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Connection dropped: "):
            self.last = message.removeprefix("Connection dropped: ")

    def __enter__(self) -> _KazooWarnings:
        self._propagate = self._logger.propagate
        self._logger.addHandler(self)
        self._logger.propagate = False
        return self

    def __exit__(self, *_: object) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate


def _setter(event: threading.Event) -> Callable[[Any], None]:
    """A ZooKeeper watch that sets `event`."""
    return lambda _watched: event.set()
