"""Real consumer groups: confluent-kafka (librdkafka), kafka-python and aiokafka subscribe,
rebalance, commit, lose members to session timeouts, and restart as static members."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from tests.conftest import FAST_JOINS
from tests.groups.helpers import describe, heartbeat
from tests.wire import WireClient

# librdkafka's defaults rejoin after up to 3 s; these keep each rebalance well under a second.
FAST_GROUP = {"heartbeat.interval.ms": 100, "session.timeout.ms": 6000, "auto.offset.reset": "earliest"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    config = {**FAST_JOINS, "group.min.session.timeout.ms": "500"}
    with EmbeddedBroker(tmp_path / "data", config=config) as running:
        yield running


def _create_topic(broker: EmbeddedBroker, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=30)


def _produce(broker: EmbeddedBroker, topic: str, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0


def _until(condition: Callable[[], bool], step: Callable[[], object], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        step()


class Ownership:
    """Who owns each partition, from the rebalance callbacks; any overlap is recorded."""

    def __init__(self) -> None:
        self.owners: dict[int, str] = {}
        self.violations: list[str] = []
        self.events: list[tuple[str, str, list[int]]] = []

    def assigned(self, name: str, partitions: list[TopicPartition]) -> None:
        self.events.append((name, "assign", [p.partition for p in partitions]))
        for p in partitions:
            if p.partition in self.owners:
                self.violations.append(f"{name} got {p.partition}, owned by {self.owners[p.partition]}")
            self.owners[p.partition] = name

    def revoked(self, name: str, partitions: list[TopicPartition]) -> None:
        self.events.append((name, "revoke", [p.partition for p in partitions]))
        for p in partitions:
            if self.owners.get(p.partition) != name:
                self.violations.append(f"{name} lost {p.partition}, owned by {self.owners.get(p.partition)}")
            self.owners.pop(p.partition, None)

    def lost(self, name: str, partitions: list[TopicPartition]) -> None:
        self.violations.append(f"{name} lost its partitions {partitions}")
        self.revoked(name, partitions)

    def held_by(self, names: set[str], partitions: int) -> bool:
        return len(self.owners) == partitions and set(self.owners.values()) == names


class GroupMember:
    """A confluent-kafka consumer that commits synchronously after processing each batch."""

    def __init__(self, name: str, config: dict[str, Any], topic: str, ownership: Ownership) -> None:
        self.name = name
        self.consumer = Consumer(config)
        self.consumed: list[str] = []
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _, partitions: ownership.assigned(name, partitions),
            on_revoke=lambda _, partitions: ownership.revoked(name, partitions),
            on_lost=lambda _, partitions: ownership.lost(name, partitions),
        )

    def poll(self) -> None:
        messages = [m for m in self.consumer.consume(200, timeout=0.05) if m.error() is None]
        if not messages:
            return
        self.consumed += [m.value().decode() for m in messages]
        positions: dict[tuple[str, int], int] = {}
        for message in messages:
            positions[message.topic(), message.partition()] = message.offset() + 1
        self.consumer.commit(
            offsets=[TopicPartition(t, p, offset) for (t, p), offset in positions.items()], asynchronous=False
        )


def test_three_confluent_consumers_join_and_leave_while_records_flow(broker: EmbeddedBroker) -> None:
    topic, partitions = "flow", 6
    _create_topic(broker, topic, partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    produced: list[str] = []
    ownership = Ownership()
    config = {**FAST_GROUP, "bootstrap.servers": broker.bootstrap_servers, "group.id": "flow"}
    config["enable.auto.commit"] = False
    active: list[GroupMember] = []
    everyone: list[GroupMember] = []

    def step() -> None:
        for _ in range(20):
            produced.append(f"value-{len(produced)}")
            producer.produce(topic, value=produced[-1])
        producer.poll(0)
        for member in active:
            member.poll()

    def join(name: str) -> None:
        member = GroupMember(name, config, topic, ownership)
        active.append(member)
        everyone.append(member)
        _until(lambda: ownership.held_by({m.name for m in active}, partitions), step)

    def leave(name: str) -> None:
        member = next(m for m in active if m.name == name)
        active.remove(member)
        member.consumer.close()
        _until(lambda: ownership.held_by({m.name for m in active}, partitions), step)

    join("c0")
    join("c1")
    join("c2")
    leave("c0")
    leave("c1")
    assert producer.flush(30) == 0
    (last,) = active
    _until(lambda: sum(len(m.consumed) for m in everyone) >= len(produced), last.poll)
    last.consumer.close()

    assert ownership.violations == []
    consumed = [value for member in everyone for value in member.consumed]
    assert len(consumed) == len(produced) and set(consumed) == set(produced)
    assert {name for name, _, _ in ownership.events} == {"c0", "c1", "c2"}


def test_kafka_python_consumer_group(broker: EmbeddedBroker) -> None:
    from kafka import KafkaConsumer
    from kafka.errors import RebalanceInProgressError

    _create_topic(broker, "kp", 4)
    values = [f"kp-{n}" for n in range(400)]
    _produce(broker, "kp", values)

    def consumer() -> KafkaConsumer:
        member = KafkaConsumer(
            group_id="kafka-python",
            bootstrap_servers=broker.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            heartbeat_interval_ms=100,
            max_poll_records=50,
        )
        member.subscribe(["kp"])
        # Fresh metadata after subscribing, before the first join. Otherwise the leader assigns
        # from the snapshot it took before subscribing ({}), and the next metadata refresh makes it
        # rejoin on its own; kafka-python 3.0.12 leaves a member whose poll times out during such a
        # rejoin in REBALANCING for good, refusing every commit.
        assert "kp" in member.topics()
        return member

    consumed: list[str] = []

    def poll(member: KafkaConsumer) -> None:
        for records in member.poll(timeout_ms=100).values():
            consumed.extend(record.value.decode() for record in records)
        # kafka-python 3 refuses to commit while it rejoins; the next poll completes the rebalance.
        with contextlib.suppress(RebalanceInProgressError):
            member.commit()

    first = consumer()
    _until(lambda: len(consumed) >= 100, lambda: poll(first))
    assert len(first.assignment()) == 4
    second = consumer()
    _until(
        lambda: (
            len(first.assignment()) == len(second.assignment()) == 2 and len(set(consumed)) == len(values)
        ),
        lambda: (poll(first), poll(second)),
    )

    def committed() -> int:
        with WireClient(broker.bootstrap_servers) as client:
            response = client.request(9, 5, group_id="kafka-python", topics=None)
        return sum(p.committed_offset for t in response.topics for p in t.partitions)

    # A commit refused during a rebalance is retried by the next poll, as an application would.
    _until(lambda: committed() == len(values), lambda: (poll(first), poll(second)))
    first.close()
    second.close()
    assert set(consumed) == set(values)


def test_aiokafka_consumer_group(broker: EmbeddedBroker) -> None:
    from aiokafka import AIOKafkaConsumer

    _create_topic(broker, "aio", 4)
    values = [f"aio-{n}" for n in range(400)]
    _produce(broker, "aio", values)

    async def scenario() -> tuple[list[str], list[int]]:
        def consumer() -> AIOKafkaConsumer:
            return AIOKafkaConsumer(
                "aio",
                group_id="aiokafka",
                bootstrap_servers=broker.bootstrap_servers,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                heartbeat_interval_ms=100,
                max_poll_records=50,
            )

        consumed: list[str] = []

        async def poll(member: AIOKafkaConsumer) -> None:
            for records in (await member.getmany(timeout_ms=100)).values():
                consumed.extend(record.value.decode() for record in records)
            await member.commit()

        async def until(condition: Callable[[], bool], *members: AIOKafkaConsumer) -> None:
            deadline = time.monotonic() + 30
            while not condition():
                assert time.monotonic() < deadline, "condition not met in time"
                for member in members:
                    await poll(member)

        first, second = consumer(), consumer()
        await first.start()
        await until(lambda: len(consumed) >= 100, first)
        sizes = [len(first.assignment())]
        await second.start()
        await until(
            lambda: len(first.assignment()) == len(second.assignment()) == 2 and set(consumed) == set(values),
            first,
            second,
        )
        sizes.append(len(first.assignment()))
        await first.stop()
        await second.stop()
        return consumed, sizes

    consumed, sizes = asyncio.run(scenario())
    assert set(consumed) == set(values)
    assert sizes == [4, 2]


_CRASHING_CONSUMER = textwrap.dedent(
    """
    import sys
    from confluent_kafka import Consumer

    consumer = Consumer({
        "bootstrap.servers": sys.argv[1], "group.id": "crash", "heartbeat.interval.ms": 100,
        "session.timeout.ms": 1000, "auto.offset.reset": "earliest",
    })
    consumer.subscribe(["crash"])
    while True:
        consumer.poll(0.1)
    """
)


def test_a_member_that_stops_heartbeating_loses_its_partitions(broker: EmbeddedBroker) -> None:
    _create_topic(broker, "crash", 4)
    ownership = Ownership()
    config = {**FAST_GROUP, "bootstrap.servers": broker.bootstrap_servers, "group.id": "crash"}
    survivor = GroupMember("survivor", config, "crash", ownership)
    _until(lambda: ownership.held_by({"survivor"}, 4), survivor.poll)
    crashing = subprocess.Popen([sys.executable, "-c", _CRASHING_CONSUMER, broker.bootstrap_servers])
    try:
        # The other process's consumer has joined once the survivor holds half the partitions.
        _until(lambda: len(ownership.owners) == 2, survivor.poll)
        crashing.send_signal(signal.SIGKILL)
        crashed_at = time.monotonic()
        crashing.wait(timeout=10)
        _until(lambda: ownership.held_by({"survivor"}, 4), survivor.poll)
        # Its session (1 s) had to run out first, not the closed connection; then the group
        # rebalanced without it. Its last heartbeat may have gone out well before the kill on a
        # loaded machine, so the bound leaves half the session for that.
        assert 0.5 < time.monotonic() - crashed_at < 10
        with WireClient(broker.bootstrap_servers) as client:
            assert [m.member_id for m in describe(client, "crash").members] == [survivor.consumer.memberid()]
    finally:
        crashing.kill()
        crashing.wait(timeout=10)
        survivor.consumer.close()
    assert ownership.violations == []


def _generation(client: WireClient, group: str, member_id: str, instance_id: str | None = None) -> int:
    """The group's generation: DescribeGroups does not tell, but a heartbeat knows a stale one."""
    return next(
        generation
        for generation in range(1, 100)
        if heartbeat(client, group, generation, member_id, instance_id) == ErrorCode.none
    )


def test_a_restarted_static_consumer_gets_its_partitions_back_without_a_rebalance(
    broker: EmbeddedBroker,
) -> None:
    _create_topic(broker, "static", 4)
    ownership = Ownership()
    config = {**FAST_GROUP, "bootstrap.servers": broker.bootstrap_servers, "group.id": "static"}
    static_config = {**config, "group.instance.id": "consumer-a"}
    first_a = GroupMember("a", static_config, "static", ownership)
    other = GroupMember("other", config, "static", ownership)
    both = lambda: (first_a.poll(), other.poll())  # noqa: E731
    _until(lambda: ownership.held_by({"a", "other"}, 4), both)
    partitions_of_a = sorted(p for p, owner in ownership.owners.items() if owner == "a")
    with WireClient(broker.bootstrap_servers) as client:
        generation = _generation(client, "static", other.consumer.memberid())
        events_of_other = [event for event in ownership.events if event[0] == "other"]

        # A static member does not leave the group when it closes (KIP-345).
        first_a.consumer.close()
        restarted_a = GroupMember("a", static_config, "static", ownership)
        _until(lambda: ownership.held_by({"a", "other"}, 4), lambda: (restarted_a.poll(), other.poll()))
        for _ in range(10):  # and nothing else happens afterwards
            restarted_a.poll()
            other.poll()

        assert sorted(p for p, owner in ownership.owners.items() if owner == "a") == partitions_of_a
        assert [event for event in ownership.events if event[0] == "other"] == events_of_other
        assert _generation(client, "static", other.consumer.memberid()) == generation
        assert restarted_a.consumer.memberid() != ""
    restarted_a.consumer.close()
    other.consumer.close()
    assert ownership.violations == []


def test_confluent_commit_with_a_stale_generation_fails(broker: EmbeddedBroker) -> None:
    """What a consumer sees when it commits after the group moved on without it."""
    _create_topic(broker, "stale", 1)
    _produce(broker, "stale", ["x"])
    config = {**FAST_GROUP, "bootstrap.servers": broker.bootstrap_servers, "group.id": "stale"}
    ownership = Ownership()
    member = GroupMember("m", {**config, "enable.auto.commit": False}, "stale", ownership)
    _until(lambda: ownership.held_by({"m"}, 1), member.poll)
    with WireClient(broker.bootstrap_servers) as client:
        # An admin removes the member; its next commit carries a generation the group no longer has.
        left = client.request(13, 3, group_id="stale", members=[{"member_id": member.consumer.memberid()}])
        assert left.members[0].error_code == ErrorCode.none
    with pytest.raises(KafkaException) as failure:
        member.consumer.commit(offsets=[TopicPartition("stale", 0, 1)], asynchronous=False)
    assert failure.value.args[0].code() in (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION)
    member.consumer.close()
