"""The controller's state machine and the znodes' JSON, without ZooKeeper."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.cluster.controller import (
    CREATE,
    ControllerStateMachine,
    Election,
    ElectionRefused,
    ReplicationFactorError,
    StateWrite,
    assign_replicas,
    next_state,
)
from onceflow.cluster.znodes import (
    NO_LEADER,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    decode_controller,
    decode_topic_config,
    encode_controller,
    encode_topic_config,
)

BROKERS = (1, 2, 3, 4)


class FakeZooKeeper:
    """State znodes with versions: a write whose expected version is stale fails, as ZooKeeper's."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[str, int], tuple[PartitionState, int]] = {}

    def apply(self, writes: list[StateWrite]) -> None:
        for write in writes:
            key = (write.topic, write.partition)
            current = self.nodes.get(key)
            assert write.expected_version == (CREATE if current is None else current[1]), write
            self.nodes[key] = (write.state, 0 if current is None else current[1] + 1)


def test_assignment_gives_each_partition_distinct_replicas_and_spreads_leaders() -> None:
    replicas = assign_replicas("orders", 6, 3, [3, 1, 2])
    assert all(len(set(nodes)) == 3 and set(nodes) == {1, 2, 3} for nodes in replicas)
    assert {nodes[0] for nodes in replicas} == {1, 2, 3}
    assert assign_replicas("orders", 6, 3, [1, 2, 3]) == replicas  # the same on every broker


@pytest.mark.parametrize("factor", [0, 4])
def test_assignment_refuses_a_replication_factor_the_live_brokers_cannot_hold(factor: int) -> None:
    with pytest.raises(ReplicationFactorError):
        assign_replicas("orders", 1, factor, [1, 2, 3])


def test_new_partition_is_led_by_its_first_live_replica() -> None:
    machine = ControllerStateMachine(7, [2, 3], {}, {}, lambda topic: False)
    writes = machine.topic_created("t", [(1, 2, 3)])
    assert writes == [StateWrite("t", 0, PartitionState(2, 0, (2, 3), 7), CREATE)]


def test_losing_the_leader_elects_the_next_in_sync_replica_and_bumps_the_epoch() -> None:
    zookeeper = FakeZooKeeper()
    machine = ControllerStateMachine(1, [1, 2, 3], {}, {}, lambda topic: False)
    zookeeper.apply(machine.topic_created("t", [(1, 2, 3)]))
    zookeeper.apply(machine.broker_down(1))
    assert zookeeper.nodes["t", 0] == (PartitionState(2, 1, (2, 3), 1), 1)
    zookeeper.apply(machine.broker_down(3))  # a follower: the ISR shrinks, the epoch moves on
    assert zookeeper.nodes["t", 0] == (PartitionState(2, 2, (2,), 1), 2)


def test_without_an_in_sync_replica_the_partition_goes_offline_unless_unclean_is_allowed() -> None:
    state = PartitionState(1, 4, (1,), 1)
    offline = next_state((1, 2), state, {2}, unclean=False, controller_epoch=1)
    assert offline == PartitionState(NO_LEADER, 5, (1,), 1)  # 1 stays the only clean leader
    assert next_state((1, 2), state, {2}, unclean=True, controller_epoch=1) == PartitionState(2, 5, (2,), 1)
    assert offline is not None
    # The last in-sync replica coming back leads again.
    assert next_state((1, 2), offline, {1, 2}, False, 1) == PartitionState(1, 6, (1,), 1)


def test_a_new_controller_elects_leaders_for_what_its_predecessor_left_undone() -> None:
    states = {("t", 0): (PartitionState(1, 3, (1, 2), 1), 5)}
    machine = ControllerStateMachine(2, [2, 3], {"t": [(1, 2, 3), (3, 2, 1)]}, states, lambda topic: False)
    assert machine.became_controller() == [
        StateWrite("t", 0, PartitionState(2, 4, (2,), 2), 5),
        StateWrite("t", 1, PartitionState(3, 0, (3, 2), 2), CREATE),
    ]


def test_a_deleted_topic_gets_no_more_state_writes() -> None:
    machine = ControllerStateMachine(1, [1, 2], {"gone": [(1, 2)], "kept": [(1, 2)]}, {}, lambda topic: False)
    machine.became_controller()
    machine.topic_deleted("gone")
    assert [write.topic for write in machine.broker_down(1)] == ["kept"]
    assert ("gone", 0) not in machine.states


events = st.lists(st.tuples(st.sampled_from(["up", "down"]), st.sampled_from(BROKERS)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(
    events=events,
    unclean=st.booleans(),
    factors=st.lists(st.integers(1, len(BROKERS)), min_size=1, max_size=3),
)
def test_every_sequence_of_broker_events_keeps_leaders_valid(
    events: list[tuple[str, int]], unclean: bool, factors: list[int]
) -> None:
    zookeeper = FakeZooKeeper()
    machine = ControllerStateMachine(1, BROKERS, {}, {}, lambda topic: unclean)
    live = set(BROKERS)
    for index, factor in enumerate(factors):
        zookeeper.apply(machine.topic_created(f"t{index}", assign_replicas(f"t{index}", 2, factor, BROKERS)))
    for kind, broker in events:
        before = dict(zookeeper.nodes)
        writes = machine.broker_up(broker) if kind == "up" else machine.broker_down(broker)
        zookeeper.apply(writes)  # every compare-and-set names the version ZooKeeper holds
        (live.add if kind == "up" else live.discard)(broker)
        for (topic, partition), (state, _) in zookeeper.nodes.items():
            replicas = machine.assignments[topic][partition]
            old = before[topic, partition][0]
            assert set(state.isr) <= set(replicas) and state.isr
            assert state.leader_epoch >= old.leader_epoch
            if state != old:
                assert state.leader_epoch == old.leader_epoch + 1
            if state.leader != NO_LEADER:
                assert state.leader in live and state.leader in state.isr
            if state.leader not in (NO_LEADER, old.leader) and not unclean:
                assert state.leader in old.isr  # clean election only
            live_in_sync = [replica for replica in old.isr if replica in live]
            if live_in_sync or (unclean and any(replica in live for replica in replicas)):
                assert state.leader != NO_LEADER  # someone who may lead does


def test_znodes_round_trip() -> None:
    registration = BrokerRegistration(3, "127.0.0.1", 9093)
    assert BrokerRegistration.decode(3, registration.encode()) == registration
    state = PartitionState(2, 5, (2, 1), 4)
    assert PartitionState.decode(state.encode()) == state
    assignment = TopicAssignment(uuid.uuid4(), ((1, 2), (2, 3)))
    assert TopicAssignment.decode(assignment.encode()) == assignment
    assert decode_controller(encode_controller(2)) == 2
    assert decode_topic_config(encode_topic_config({"min.insync.replicas": "2"})) == {
        "min.insync.replicas": "2"
    }


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"leader": "1"}',
        b'{"leader": 1, "leader_epoch": 0, "isr": [true], "controller_epoch": 1}',
    ],
)
def test_a_malformed_state_znode_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        PartitionState.decode(data)


def test_a_malformed_assignment_is_refused() -> None:
    with pytest.raises(ValueError):
        TopicAssignment.decode(b'{"topic_id": "nope", "partitions": {"0": [1]}}')
    with pytest.raises(ValueError):
        TopicAssignment.decode(f'{{"topic_id": "{uuid.uuid4()}", "partitions": {{"1": [1]}}}}'.encode())


@pytest.mark.parametrize(
    ("current", "live", "election", "expected"),
    [
        # Preferred: leadership goes back to the first replica once it is live and in the ISR.
        (PartitionState(2, 4, (2, 1), 9), {1, 2}, Election.PREFERRED, PartitionState(1, 5, (2, 1), 9)),
        (PartitionState(1, 4, (1, 2), 9), {1, 2}, Election.PREFERRED, ElectionRefused.NOT_NEEDED),
        (PartitionState(2, 4, (2,), 9), {1, 2}, Election.PREFERRED, ElectionRefused.PREFERRED_NOT_AVAILABLE),
        (PartitionState(2, 4, (2, 1), 9), {2}, Election.PREFERRED, ElectionRefused.PREFERRED_NOT_AVAILABLE),
        # A preferred leader whose broker died is no leader: electing it again is needed.
        (PartitionState(1, 4, (1, 2), 9), {2}, Election.PREFERRED, ElectionRefused.PREFERRED_NOT_AVAILABLE),
        # Unclean: only for a partition without a live leader; the ISR first, else any live replica.
        (PartitionState(2, 4, (2, 3), 9), {1, 2, 3}, Election.UNCLEAN, ElectionRefused.NOT_NEEDED),
        (PartitionState(-1, 4, (3,), 9), {1, 3}, Election.UNCLEAN, PartitionState(3, 5, (3,), 9)),
        (PartitionState(-1, 4, (3,), 9), {2}, Election.UNCLEAN, PartitionState(2, 5, (2,), 9)),
        (PartitionState(-1, 4, (3,), 9), set(), Election.UNCLEAN, ElectionRefused.NO_ELIGIBLE_LEADER),
    ],
)
def test_elections_asked_for(
    current: PartitionState, live: set[int], election: Election, expected: PartitionState | ElectionRefused
) -> None:
    machine = ControllerStateMachine(9, live, {"t": [(1, 2, 3)]}, {("t", 0): (current, 7)}, lambda _: False)
    writes, outcomes = machine.elect([("t", 0), ("t", 1), ("u", 0)], election)
    assert outcomes[("t", 1)] == outcomes[("u", 0)] == ElectionRefused.UNKNOWN_PARTITION
    if isinstance(expected, ElectionRefused):
        assert (writes, outcomes[("t", 0)]) == ([], expected)
    else:
        assert writes == [StateWrite("t", 0, expected, 7)]  # a compare-and-set on the version read
        assert outcomes[("t", 0)] == expected.leader
        assert machine.states[("t", 0)] == (expected, 8)
