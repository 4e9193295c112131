"""Three broker processes that form a cluster through a real ZooKeeper, with real clients."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kafka import KafkaProducer
from kazoo.client import KazooClient
from kio.schema.errors import ErrorCode

from onceflow.cluster.znodes import PartitionState, partition_state_path
from tests.cluster_mode.conftest import BROKER_IDS, Cluster, start_cluster
from tests.conftest import wait_until
from tests.wire import WireClient, make_batch, produce

pytestmark = pytest.mark.zookeeper


def create_topic(cluster: Cluster, name: str, partitions: int, factor: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, factor, config=configs)])[name].result(20)


def first_value(cluster: Cluster, topic: str, partition: int) -> bytes | None:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": f"{topic}-reader"})
    consumer.assign([TopicPartition(topic, partition, 0)])
    message = consumer.poll(20)
    consumer.close()
    assert message is not None and message.error() is None, message
    return message.value()


def fetch_error(address: str, topic: str, partition: int) -> int:
    with WireClient(address) as client:
        response = client.fetch({topic: [partition]})
    return int(response.responses[0].partitions[0].error_code)


def test_brokers_agree_on_topics_replicas_and_leaders(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    create_topic(cluster, "orders", 3, 3)
    for partition_index in range(3):  # each broker learns the leaders when its watches fire
        cluster.wait_for_leader("orders", partition_index)
    described = [cluster.metadata(broker_id, "orders") for broker_id in BROKER_IDS]
    first = described[0]
    assert sorted(broker.node_id for broker in first.brokers) == list(BROKER_IDS)
    assert first.controller_id in BROKER_IDS
    topic = first.topics[0]
    assert topic.error_code == ErrorCode.none
    for partition in topic.partitions:
        assert sorted(partition.replica_nodes) == list(BROKER_IDS)
        assert sorted(partition.isr_nodes) == list(BROKER_IDS)
        assert partition.leader_id == partition.replica_nodes[0]
    # Leaders spread over the brokers, and every broker says the same (topic id included).
    assert {partition.leader_id for partition in topic.partitions} == set(BROKER_IDS)
    for other in described[1:]:
        assert (other.brokers, other.controller_id, other.topics) == (
            first.brokers,
            first.controller_id,
            first.topics,
        )

    with WireClient(cluster.brokers[2].bootstrap_servers) as client:
        pages = client.request(75, 0, topics=[{"name": "orders"}], response_partition_limit=100, cursor=None)
    assert [
        (partition.leader_id, partition.leader_epoch, partition.replica_nodes, partition.isr_nodes)
        for partition in pages.topics[0].partitions
    ] == [
        (partition.leader_id, partition.leader_epoch, partition.replica_nodes, partition.isr_nodes)
        for partition in topic.partitions
    ]

    with pytest.raises(KafkaException) as refused:
        create_topic(cluster, "too-many", 1, 4)
    assert refused.value.args[0].code() == ErrorCode.invalid_replication_factor
    with pytest.raises(KafkaException) as refused:
        create_topic(cluster, "no-copies", 1, 0)
    assert "must be at least 1" in refused.value.args[0].str()


def test_auto_created_topics_take_the_default_replication_factor(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    first = cluster.metadata(2, "auto", auto_create=True).topics[0]
    assert first.error_code in (ErrorCode.leader_not_available, ErrorCode.none)
    partition = cluster.wait_for_leader("auto")
    assert sorted(partition.replica_nodes) == list(BROKER_IDS)


def test_only_the_leader_takes_produce_and_fetch(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    create_topic(cluster, "single", 1, 2)
    partition = cluster.wait_for_leader("single")
    followers = [broker_id for broker_id in BROKER_IDS if broker_id != partition.leader_id]
    leader_address = cluster.brokers[partition.leader_id].bootstrap_servers
    for broker_id in [*followers, partition.leader_id]:
        address = cluster.brokers[broker_id].bootstrap_servers
        with WireClient(address) as client:
            answer = produce(client, "single", 0, make_batch([b"x"]), acks=1, version=10)
        expected = ErrorCode.none if broker_id == partition.leader_id else ErrorCode.not_leader_or_follower
        assert (broker_id, answer.error_code) == (broker_id, expected)
        assert (broker_id, fetch_error(address, "single", 0)) == (broker_id, expected)
    # KIP-951: a follower names the leader, and where to reach it, so clients skip a Metadata round.
    leader = (partition.leader_id, partition.leader_epoch)
    for broker_id in followers:
        with WireClient(cluster.brokers[broker_id].bootstrap_servers) as client:
            answer = produce(client, "single", 0, make_batch([b"x"]), acks=1, version=10)
            fetched = client.fetch({"single": [0]}, 12)
            with_endpoints = client.fetch({cluster.metadata(broker_id, "single").topics[0].topic_id: [0]}, 16)
        for named in (answer.current_leader, fetched.responses[0].partitions[0].current_leader):
            assert (named.leader_id, named.leader_epoch) == leader
        [endpoint] = with_endpoints.node_endpoints
        assert (endpoint.node_id, f"{endpoint.host}:{endpoint.port}") == (partition.leader_id, leader_address)


def test_a_leader_that_is_not_live_is_answered_as_no_leader(shared_cluster: Cluster) -> None:
    """Between a leader's death and the controller's election of another, ZooKeeper still names
    the dead broker. Clients are told there is no leader (LEADER_NOT_AVAILABLE, leader -1), as
    Kafka's metadata cache answers: a kafka-python producer told of a leader missing from the
    answer's brokers failed on every round of its I/O thread and never asked again."""
    cluster = shared_cluster
    create_topic(cluster, "orphaned", 1, 3)
    led = cluster.wait_for_leader("orphaned")
    dead = 9  # registered nowhere, as a broker whose session just ended
    path = partition_state_path("orphaned", 0)
    zookeeper = KazooClient(hosts=cluster.zookeeper.connect_string)
    zookeeper.start(timeout=30)
    try:
        data, stat = zookeeper.get(path)
        state = PartitionState.decode(data)
        orphaned = replace(state, leader=dead, leader_epoch=state.leader_epoch + 1, isr=(dead,))
        zookeeper.set(path, orphaned.encode(), version=stat.version)  # as a controller writes it
        wait_until(
            lambda: all(
                cluster.partition(b, "orphaned").leader_epoch == orphaned.leader_epoch for b in BROKER_IDS
            )
        )
        for broker_id in BROKER_IDS:
            answer = cluster.metadata(broker_id, "orphaned")
            partition = answer.topics[0].partitions[0]
            assert dead not in [broker.node_id for broker in answer.brokers]
            assert (partition.error_code, partition.leader_id) == (ErrorCode.leader_not_available, -1)
            assert partition.leader_epoch == orphaned.leader_epoch
            with WireClient(cluster.brokers[broker_id].bootstrap_servers) as client:
                refused = produce(client, "orphaned", 0, make_batch([b"x"]), acks=1, version=10)
            assert refused.error_code == ErrorCode.not_leader_or_follower
            assert refused.current_leader.leader_id == -1
        # A producer that starts now, before the election, delivers once it is made.
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
        sent = producer.send("orphaned", b"after the election")
        _, stat = zookeeper.get(path)
        elected = replace(state, leader_epoch=orphaned.leader_epoch + 1)
        zookeeper.set(path, elected.encode(), version=stat.version)
        assert sent.get(timeout=30).offset >= 0
        producer.close(timeout=10)
    finally:
        zookeeper.stop()
    assert cluster.wait_for_leader("orphaned").leader_id == led.leader_id


def test_a_killed_leader_is_replaced_from_the_isr_and_no_acknowledged_record_is_lost(
    cluster: Cluster,
) -> None:
    create_topic(cluster, "payments", 1, 3, **{"min.insync.replicas": "2"})
    before = cluster.wait_for_leader("payments")
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap_servers, "acks": "all", "message.timeout.ms": 30000}
    )
    delivered: list[tuple[object, int]] = []

    def sent(error: object, message: object) -> None:
        delivered.append((error, message.offset()))  # type: ignore[attr-defined]

    for index in range(5):
        producer.produce("payments", value=b"before-%d" % index, on_delivery=sent)
    assert producer.flush(20) == 0

    cluster.brokers[before.leader_id].kill()
    after = cluster.wait_for_leader("payments", not_on=before.leader_id)
    assert after.leader_id in before.isr_nodes
    assert after.leader_epoch == before.leader_epoch + 1
    assert before.leader_id not in after.isr_nodes
    assert after.offline_replicas == (before.leader_id,)

    for index in range(5):
        producer.produce("payments", value=b"after-%d" % index, on_delivery=sent)
    assert producer.flush(30) == 0
    assert [error for error, _ in delivered] == [None] * 10
    # The new leader had every acknowledged record (acks=all waits for the whole ISR).
    assert [offset for _, offset in delivered] == list(range(10))
    with WireClient(cluster.brokers[after.leader_id].bootstrap_servers) as client:
        for current, expected in [
            (after.leader_epoch, ErrorCode.none),
            (before.leader_epoch, ErrorCode.fenced_leader_epoch),
            (after.leader_epoch + 1, ErrorCode.unknown_leader_epoch),
        ]:
            answer = client.request(
                23,
                4,
                replica_id=-1,
                topics=[
                    {
                        "topic": "payments",
                        "partitions": [
                            {"partition": 0, "current_leader_epoch": current, "leader_epoch": current}
                        ],
                    }
                ],
            )
            assert answer.topics[0].partitions[0].error_code == expected
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "readers", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("payments", 0, 0)])
    read: list[bytes] = []
    wait_until(
        lambda: read.extend(m.value() for m in consumer.consume(10, 0.5) if not m.error()) or len(read) >= 10
    )
    consumer.close()
    assert read == [b"before-%d" % index for index in range(5)] + [b"after-%d" % index for index in range(5)]


@pytest.fixture
def long_session_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Sessions of 4 s, the longest the test ZooKeeper allows."""
    yield from start_cluster(tmp_path, {"zookeeper.session.timeout.ms": "4000"})


def test_a_broker_killed_and_started_again_at_once_waits_for_its_old_session(
    long_session_cluster: Cluster,
) -> None:
    """Its old registration outlives it by up to a session timeout. Kafka's broker waits for
    it to go, and so does this one; before, it exited at once: its id was taken."""
    cluster = long_session_cluster
    cluster.brokers[3].kill()
    assert 3 in [broker.node_id for broker in cluster.metadata(1).brokers]  # still registered
    restarted = cluster.brokers[3].start()  # the same command, at once
    assert restarted.process is not None
    wait_until(lambda: 3 in [broker.node_id for broker in cluster.metadata(1).brokers], timeout_s=30)
    assert restarted.process.poll() is None


def test_the_controller_fails_over_and_elects_leaders(cluster: Cluster) -> None:
    create_topic(cluster, "ledger", 1, 3, **{"min.insync.replicas": "2"})
    controller = cluster.metadata(1).controller_id
    cluster.brokers[controller].kill()
    survivors = [broker_id for broker_id in BROKER_IDS if broker_id != controller]

    def new_controller() -> bool:
        return all(
            cluster.metadata(broker_id).controller_id not in (controller, -1) for broker_id in survivors
        )

    wait_until(new_controller, timeout_s=60)
    assert len({cluster.metadata(broker_id).controller_id for broker_id in survivors}) == 1
    # Two of three in sync: acks=all is taken (one of three: tests/cluster_mode/test_scenarios.py).
    leader = cluster.wait_for_leader("ledger", not_on=controller).leader_id
    with WireClient(cluster.brokers[leader].bootstrap_servers) as client:
        assert produce(client, "ledger", 0, make_batch([b"a"])).error_code == ErrorCode.none


def test_no_two_brokers_hand_out_the_same_producer_id(shared_cluster: Cluster) -> None:
    ids: list[int] = []
    for broker in shared_cluster.brokers.values():
        with WireClient(broker.bootstrap_servers) as client:
            for _ in range(2):
                # COORDINATOR_LOAD_IN_PROGRESS while its block comes from ZooKeeper: asked again.
                wait_until(lambda client=client: _new_producer_id(client, ids), 30)
    assert len(set(ids)) == len(ids) == 2 * len(BROKER_IDS)


def test_a_leader_drops_a_silent_follower_from_the_isr_and_acks_all_goes_on(
    quick_lag_cluster: Cluster,
) -> None:
    cluster = quick_lag_cluster
    create_topic(cluster, "audit", 1, 3)
    leader = cluster.wait_for_leader("audit").leader_id
    follower = next(broker_id for broker_id in BROKER_IDS if broker_id != leader)
    process = cluster.brokers[follower].process
    assert process is not None
    process.send_signal(signal.SIGSTOP)  # no fetches, but its ZooKeeper session lives on a while
    try:
        with WireClient(cluster.brokers[leader].bootstrap_servers) as client:
            answer = produce(client, "audit", 0, make_batch([b"while-stopped"]))
            # Answered once the leader dropped the follower: before its session ended.
            isr = cluster.partition(leader, "audit").isr_nodes
            registered = [broker.node_id for broker in cluster.metadata(leader).brokers]
        assert answer.error_code == ErrorCode.none
        assert follower not in isr and len(isr) == 2
        assert follower in registered
    finally:
        process.send_signal(signal.SIGCONT)


def test_a_replica_that_comes_back_catches_up_with_its_leader_and_rejoins_the_isr(cluster: Cluster) -> None:
    """Also when, meanwhile, DeleteRecords moved the leader's log start past the replica's end:
    it starts again there (Kafka's truncateFullyAndStartAt)."""
    create_topic(cluster, "ledger", 1, 3, **{"min.insync.replicas": "2"})
    leader = cluster.wait_for_leader("ledger").leader_id
    returning = next(broker_id for broker_id in BROKER_IDS if broker_id != leader)
    other = next(broker_id for broker_id in BROKER_IDS if broker_id not in (leader, returning))

    def write(*values: bytes) -> None:
        with WireClient(cluster.brokers[leader].bootstrap_servers) as client:
            assert produce(client, "ledger", 0, make_batch(list(values))).error_code == ErrorCode.none

    write(b"a", b"b")
    cluster.brokers[returning].kill()
    wait_until(lambda: returning not in cluster.partition(leader, "ledger").isr_nodes, timeout_s=60)
    write(b"c")  # while it is away
    write(b"d")
    admin = AdminClient({"bootstrap.servers": cluster.brokers[leader].bootstrap_servers})
    start = TopicPartition("ledger", 0, 3)
    assert admin.delete_records([start])[start].result(20).low_watermark == 3  # past the replica's end, 2
    wait_until(lambda: returning not in [broker.node_id for broker in cluster.metadata(leader).brokers])
    cluster.brokers[returning].start()
    wait_until(lambda: returning in cluster.partition(leader, "ledger").isr_nodes, timeout_s=60)
    write(b"e")  # acks=all: the returned replica has it too
    assert (cluster.brokers[returning].data_dir / "ledger-0" / "log-start-offset").read_text().strip() == "3"

    # With the other two gone, the returned replica leads, with every acknowledged record kept.
    cluster.brokers[leader].kill()
    cluster.brokers[other].kill()
    wait_until(lambda: cluster.partition(returning, "ledger").leader_id == returning, timeout_s=60)
    # Nothing to commit: __consumer_offsets does not exist yet and cannot be created with one broker
    # of three live (3 replicas, as Kafka's), so there is no group coordinator and a commit would wait.
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": "audit", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("ledger", 0, OFFSET_BEGINNING)])
    read: list[bytes] = []
    wait_until(
        lambda: read.extend(m.value() for m in consumer.consume(4, 0.5) if not m.error()) or len(read) >= 2
    )
    consumer.close()
    assert read == [b"d", b"e"]


def test_idle_replica_fetchers_long_poll_instead_of_spinning(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    create_topic(cluster, "quiet", 3, 3)
    for partition_index in range(3):  # every broker leads one partition and follows two
        cluster.wait_for_leader("quiet", partition_index)
    processes = {broker_id: broker.process for broker_id, broker in cluster.brokers.items()}

    def cpu_s() -> dict[int, float]:
        ticks = os.sysconf("SC_CLK_TCK")
        used = {}
        for broker_id, process in processes.items():
            assert process is not None
            fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            used[broker_id] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
        return used

    started, before = time.monotonic(), cpu_s()
    time.sleep(2)  # the measurement's window, not a wait for a condition
    elapsed, after = time.monotonic() - started, cpu_s()
    # Each follower asks once per 500 ms long poll: about 1% of a core (spinning took over 50%).
    busy = {broker_id: (after[broker_id] - before[broker_id]) / elapsed for broker_id in processes}
    assert all(share < 0.10 for share in busy.values()), busy


def test_a_follower_fetches_all_it_follows_from_a_leader_over_one_connection(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    create_topic(cluster, "fanout", 12, 3)  # every broker follows four partitions from each other one
    for partition_index in range(12):
        cluster.wait_for_leader("fanout", partition_index)

    def connections_to_leaders() -> dict[tuple[int, int], int]:
        """(follower, leader): the follower's established TCP connections to the leader's port."""
        established = _established_connections()
        counts = {}
        for follower_id, follower in cluster.brokers.items():
            assert follower.process is not None
            inodes = _socket_inodes(follower.process.pid)
            for leader_id, leader in cluster.brokers.items():
                if leader_id != follower_id:
                    counts[follower_id, leader_id] = sum(
                        1 for inode, port in established if port == leader.port and inode in inodes
                    )
        return counts

    # Fetches for other topics share that connection too: one per leader, not one per partition.
    wait_until(lambda: set(connections_to_leaders().values()) == {1})


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def _established_connections() -> list[tuple[int, int]]:
    """(socket inode, remote port) of every established IPv4 TCP connection on this host."""
    connections = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port, state, inode = int(fields[2].split(":")[1], 16), fields[3], int(fields[9])
        if state == "01":
            connections.append((inode, remote_port))
    return connections


def described_configs(address: str, topic: str) -> dict[str, str]:
    """The topic's effective configs as one broker's DescribeConfigs (v4) reports them."""
    with WireClient(address) as client:
        response = client.request(
            32,
            4,
            resources=[{"resource_type": 2, "resource_name": topic, "configuration_keys": None}],
            include_synonyms=False,
            include_documentation=False,
        )
    [described] = response.results
    assert described.error_code == ErrorCode.none, described.error_message
    return {config.name: config.value for config in described.configs}


def test_topic_config_changes_reach_every_broker(shared_cluster: Cluster) -> None:
    """IncrementalAlterConfigs sent to one broker goes to the topic's config znode, and every
    broker applies it to its replicas; validate_only changes nothing."""
    cluster = shared_cluster
    create_topic(cluster, "configured", 1, 3)
    partition = cluster.wait_for_leader("configured")
    admin = AdminClient({"bootstrap.servers": cluster.brokers[BROKER_IDS[0]].bootstrap_servers})

    def alter(validate_only: bool, **configs: str) -> None:
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in configs.items()
        ]
        resource = ConfigResource("topic", "configured", incremental_configs=entries)
        admin.incremental_alter_configs([resource], validate_only=validate_only)[resource].result(20)

    alter(True, **{"cleanup.policy": "compact"})
    alter(False, **{"retention.ms": "1234567", "min.insync.replicas": "4"})

    def everywhere() -> bool:
        return all(
            described_configs(broker.bootstrap_servers, "configured")["retention.ms"] == "1234567"
            for broker in cluster.brokers.values()
        )

    wait_until(everywhere, timeout_s=20)
    for broker in cluster.brokers.values():
        described = described_configs(broker.bootstrap_servers, "configured")
        assert (described["min.insync.replicas"], described["cleanup.policy"]) == ("4", "delete")
    # In effect on the leader, wherever the request went: an ISR of 3 is below 4.
    with WireClient(cluster.brokers[partition.leader_id].bootstrap_servers) as client:
        answer = produce(client, "configured", 0, make_batch([b"x"]), acks=-1)
    assert answer.error_code == ErrorCode.not_enough_replicas


def test_delete_records_moves_the_start_of_every_replica(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    create_topic(cluster, "trimmed", 1, 3)
    leader = cluster.wait_for_leader("trimmed").leader_id
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for number in range(10):
        producer.produce("trimmed", value=f"v{number}")
    assert producer.flush(20) == 0
    follower = next(broker_id for broker_id in BROKER_IDS if broker_id != leader)
    with WireClient(cluster.brokers[follower].bootstrap_servers) as client:
        refused = client.request(
            21,
            2,
            topics=[{"name": "trimmed", "partitions": [{"partition_index": 0, "offset": 4}]}],
            timeout=5000,
        )
    assert refused.topics[0].partitions[0].error_code == ErrorCode.not_leader_or_follower

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})  # it finds the leader
    deleted = admin.delete_records([TopicPartition("trimmed", 0, 4)])[TopicPartition("trimmed", 0, 4)].result(
        20
    )
    assert deleted.low_watermark == 4

    with WireClient(cluster.brokers[leader].bootstrap_servers) as client:
        assert client.list_offset("trimmed", 0, -2) == 4  # the earliest offset
    # The followers learn the new start from their next fetch (a record wakes their long poll).
    producer.produce("trimmed", value=b"v10")
    assert producer.flush(20) == 0
    replicas = {broker_id: cluster.brokers[broker_id].data_dir / "trimmed-0" for broker_id in BROKER_IDS}
    wait_until(
        lambda: all(
            (replica / "log-start-offset").exists()
            and (replica / "log-start-offset").read_text().strip() == "4"
            for replica in replicas.values()
        ),
        timeout_s=20,
    )


def test_new_partitions_reach_every_broker_with_the_topics_replication_factor(
    shared_cluster: Cluster,
) -> None:
    cluster = shared_cluster
    create_topic(cluster, "growing", 1, 3)
    cluster.wait_for_leader("growing")
    admin = AdminClient({"bootstrap.servers": cluster.brokers[BROKER_IDS[-1]].bootstrap_servers})

    def grow(count: int, validate_only: bool = False, assignments: list[list[int]] | None = None) -> int:
        new = (
            NewPartitions("growing", count)
            if assignments is None
            else NewPartitions("growing", count, assignments)
        )
        future = admin.create_partitions([new], validate_only=validate_only, operation_timeout=20)["growing"]
        try:
            future.result(20)
        except KafkaException as error:
            return int(error.args[0].code())
        return 0

    assert grow(3, validate_only=True) == 0
    assert grow(3, assignments=[[1, 99], [2, 3]]) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert len(cluster.metadata(BROKER_IDS[0], "growing").topics[0].partitions) == 1
    assert grow(3) == 0
    assert grow(2) == KafkaError.INVALID_PARTITIONS

    def grown(broker_id: int) -> bool:
        partitions = cluster.metadata(broker_id, "growing").topics[0].partitions
        return len(partitions) == 3 and all(
            len(partition.replica_nodes) == 3 and partition.leader_id != -1 for partition in partitions
        )

    # The answer came once the new leaders were elected; every broker's view follows a little later.
    for broker_id in BROKER_IDS:
        wait_until(lambda broker_id=broker_id: grown(broker_id))
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    producer.produce("growing", value=b"in-a-new-partition", partition=2)
    assert producer.flush(20) == 0
    assert first_value(cluster, "growing", 2) == b"in-a-new-partition"


def test_a_deleted_topic_leaves_every_broker_and_a_new_one_of_its_name_starts_empty(
    shared_cluster: Cluster,
) -> None:
    cluster = shared_cluster
    create_topic(cluster, "doomed", 2, 3)
    cluster.wait_for_leader("doomed")
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    for number in range(20):
        producer.produce("doomed", value=f"old-{number}", partition=number % 2)
    assert producer.flush(20) == 0
    replicas = [
        broker.data_dir / f"doomed-{partition}" for broker in cluster.brokers.values() for partition in (0, 1)
    ]
    assert all(replica.is_dir() for replica in replicas)

    # Sent to one broker; the controller deletes the znodes, every broker its replicas.
    admin = AdminClient({"bootstrap.servers": cluster.brokers[BROKER_IDS[-1]].bootstrap_servers})
    admin.delete_topics(["doomed"], operation_timeout=20)["doomed"].result(20)
    wait_until(lambda: not any(replica.exists() for replica in replicas), timeout_s=20)
    for broker_id in BROKER_IDS:
        [topic] = cluster.metadata(broker_id, "doomed").topics
        assert topic.error_code == ErrorCode.unknown_topic_or_partition
    with pytest.raises(KafkaException) as unknown:
        admin.delete_topics(["doomed"], operation_timeout=20)["doomed"].result(20)
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    create_topic(cluster, "doomed", 1, 3)
    cluster.wait_for_leader("doomed")
    producer.produce("doomed", value="new", partition=0)
    assert producer.flush(20) == 0
    assert first_value(cluster, "doomed", 0) == b"new"


def _new_producer_id(client: WireClient, ids: list[int]) -> bool:
    answer = client.init_producer_id()
    if answer.error_code == ErrorCode.coordinator_load_in_progress:
        return False
    ids.append(answer.producer_id)
    return True
