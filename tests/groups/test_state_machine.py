"""Random sequences of group requests and clock advances against the coordinator itself.

The coordinator does not know what assignments mean, so the properties are its own: at most
one leader per generation, generations that never go back, every request answered exactly
once, and no request left waiting once time has passed every timeout. Replaying the log
rebuilds the same offsets and group state.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from onceflow.coordinator.group import NEW_MEMBER_JOIN_TIMEOUT_MS, GroupCoordinator
from onceflow.coordinator.group_metadata import (
    JoinResult,
    OffsetAndMetadata,
    Protocol,
    SyncResult,
    TopicPartition,
)
from onceflow.coordinator.group_requests import GroupConfig, JoinRequest, MemberIdentity, SyncRequest
from tests.memory_coordinator_log import MemoryLog

GROUP = "g"
PARTITION = TopicPartition("t", 0)
ACTIONS = ("join", "join-changed", "sync", "heartbeat", "leave", "commit", "advance")


@dataclass
class Client:
    instance_id: str | None
    rebalance_timeout_ms: int
    member_id: str = ""
    generation: int = -1
    leads: tuple[str, ...] = ()  # the members to assign, when told it is the leader
    subscription: bytes = b"a"


@dataclass
class Harness:
    coordinator: GroupCoordinator
    clients: list[Client]
    now: int = 0
    waiting: dict[int, str] = field(default_factory=dict)
    request_ids: itertools.count[int] = field(default_factory=itertools.count)
    latest_generation: int = 0
    leaders: dict[int, set[str]] = field(default_factory=dict)
    protocols: dict[int, str | None] = field(default_factory=dict)

    def callback(self, what: str, handle: Callable[[Any], None]) -> Callable[[Any], None]:
        request_id = next(self.request_ids)
        self.waiting[request_id] = what

        def respond(result: Any) -> None:
            assert request_id in self.waiting, f"{what} answered twice"
            del self.waiting[request_id]
            handle(result)

        return respond

    def joined(self, client: Client, result: JoinResult) -> None:
        if result.error == ErrorCode.member_id_required:
            client.member_id = result.member_id
        elif result.error in (ErrorCode.unknown_member_id, ErrorCode.fenced_instance_id):
            client.member_id, client.generation, client.leads = "", -1, ()
        elif result.error == ErrorCode.none:
            assert result.generation_id >= self.latest_generation, "a generation went back"
            self.latest_generation = result.generation_id
            assert (
                self.protocols.setdefault(result.generation_id, result.protocol_name) == result.protocol_name
            )
            if result.members:
                assert result.leader_id == result.member_id
                leaders = self.leaders.setdefault(result.generation_id, set())
                leaders.add(result.member_id)
                assert len(leaders) == 1, f"two leaders in generation {result.generation_id}"
            client.member_id, client.generation = result.member_id, result.generation_id
            client.leads = tuple(member.member_id for member in result.members)

    def synced(self, generation: int, result: SyncResult) -> None:
        if result.error == ErrorCode.none and result.assignment:
            # Assignments name their generation: nobody gets one from another generation.
            assert result.assignment.split(b":")[0] == str(generation).encode()

    def act(self, action: str, client: Client, amount: int) -> None:
        coordinator, now = self.coordinator, self.now
        if action in ("join", "join-changed"):
            if action == "join-changed":
                client.subscription = b"b" if client.subscription == b"a" else b"a"
            join = JoinRequest(
                GROUP,
                client.member_id,
                client.instance_id,
                "client",
                "",
                1000,
                client.rebalance_timeout_ms,
                "consumer",
                (Protocol("range", client.subscription), Protocol("roundrobin", b"")),
                require_known_member_id=True,
            )
            coordinator.join_group(join, now, self.callback("join", lambda r: self.joined(client, r)))
        elif action == "sync":
            assignments = {member: f"{client.generation}:{member}".encode() for member in client.leads}
            generation = client.generation
            sync = SyncRequest(
                GROUP, generation, client.member_id, client.instance_id, None, None, assignments
            )
            coordinator.sync_group(sync, now, self.callback("sync", lambda r: self.synced(generation, r)))
        elif action == "heartbeat":
            coordinator.heartbeat(GROUP, client.member_id, client.instance_id, client.generation, now)
        elif action == "leave":
            coordinator.leave_group(GROUP, [MemberIdentity(client.member_id, client.instance_id)], now)
        elif action == "commit":
            offsets = {PARTITION: OffsetAndMetadata(amount)}
            coordinator.commit_offsets(
                GROUP, client.generation, client.member_id, client.instance_id, offsets, now
            )
        else:
            self.now += amount
            coordinator.tick(self.now)


steps = st.lists(
    st.tuples(st.sampled_from(ACTIONS), st.integers(0, 3), st.integers(0, 2500)), min_size=1, max_size=80
)


@pytest.mark.soak  # a long randomized run
@settings(max_examples=200, deadline=None)
@given(steps=steps, initial_delay_ms=st.sampled_from([0, 400]))
def test_group_coordinator_invariants(steps: list[tuple[str, int, int]], initial_delay_ms: int) -> None:
    config = GroupConfig(initial_rebalance_delay_ms=initial_delay_ms, min_session_timeout_ms=100)
    log = MemoryLog()
    harness = Harness(
        GroupCoordinator(log, {PARTITION}.__contains__, config, 0),
        [Client(None, 1500), Client(None, 500), Client(None, 3000), Client("static", 1500)],
    )
    for action, client, amount in steps:
        harness.act(action, harness.clients[client], amount)
    # Steer towards sequences that get through many rebalances.
    target(harness.latest_generation)
    event("generations reached", str(min(harness.latest_generation, 5)))
    # Past every timeout (ticking along the way, as the broker does), nothing waits.
    for _ in range(20):
        harness.act("advance", harness.clients[0], NEW_MEMBER_JOIN_TIMEOUT_MS // 4)
    assert harness.waiting == {}

    coordinator = harness.coordinator
    described = coordinator.describe_group(GROUP)
    assert described is None or (described.state.value, described.members) == ("Empty", ())
    replayed = GroupCoordinator(log, {PARTITION}.__contains__, config, harness.now)
    assert replayed.describe_group(GROUP) == described
    fetched = coordinator.fetch_offsets(GROUP, None, require_stable=True)
    assert replayed.fetch_offsets(GROUP, None, require_stable=True) == fetched
