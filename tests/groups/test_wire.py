"""The group APIs byte for byte: every error code of the classic protocol, rebalances,
timeouts, static membership, offsets, transactional offsets, and group administration."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from onceflow.broker.core import Broker
from onceflow.coordinator.group_metadata import OffsetAndMetadata, TopicPartition
from onceflow.coordinator.group_requests import StagedOffset
from tests.conftest import FAST_JOINS, wait_until
from tests.groups.helpers import (
    begin_offsets_transaction,
    commit,
    complete_transaction,
    describe,
    fetch,
    group_shard,
    heartbeat,
    join,
    join_new,
    on_broker_loop,
    send_join,
    send_sync,
    sync,
    txn_commit,
)
from tests.wire import WireClient

TOPIC = "events"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    # Short session timeouts keep the timeout tests fast.
    config = {**FAST_JOINS, "group.min.session.timeout.ms": "100"}
    with EmbeddedBroker(tmp_path / "data", config=config) as running:
        with WireClient(running.bootstrap_servers) as client:
            assert client.create_topic(TOPIC, 2) == ErrorCode.none
        yield running


@pytest.fixture
def client(broker: EmbeddedBroker) -> Iterator[WireClient]:
    with WireClient(broker.bootstrap_servers) as wire:
        yield wire


def _stable_member(client: WireClient, group: str, **options: object) -> tuple[str, int]:
    joined = join_new(client, group, **options)
    assert joined.error_code == ErrorCode.none
    assignment = {joined.member_id: b"all"} if joined.leader == joined.member_id else {}
    assert sync(client, group, joined.generation_id, joined.member_id, assignments=assignment).error_code == (
        ErrorCode.none
    )
    return joined.member_id, joined.generation_id


def _two_member_group(
    a: WireClient,
    b: WireClient,
    instance_ids: tuple[str | None, str | None] = (None, None),
    **options: object,
) -> tuple[str, str, int]:
    """A Stable group "g" of two members, A leading; their member ids and the generation."""
    member_a, _ = _stable_member(a, "g", instance_id=instance_ids[0], **options)
    b_joining = send_join(b, "g", instance_id=instance_ids[1], **options)  # type: ignore[arg-type]
    if instance_ids[1] is None:
        b_joining = send_join(b, "g", b_joining.result().member_id, **options)  # type: ignore[arg-type]
    a_joined = join(a, "g", member_a, instance_id=instance_ids[0], **options)
    b_joined = b_joining.result()
    generation = a_joined.generation_id
    b_syncing = send_sync(b, "g", generation, b_joined.member_id, instance_id=instance_ids[1])
    assignments = {member_a: b"partitions of a", b_joined.member_id: b"partitions of b"}
    assert sync(
        a, "g", generation, member_a, assignments=assignments, instance_id=instance_ids[0]
    ).assignment == (b"partitions of a")
    assert b_syncing.result().assignment == b"partitions of b"
    return member_a, b_joined.member_id, generation


def test_a_new_member_gets_its_id_then_leads_the_first_generation(client: WireClient) -> None:
    first = join(client, "g")
    assert first.error_code == ErrorCode.member_id_required
    assert first.member_id.startswith("wire-test-")
    joined = join(client, "g", first.member_id)
    assert (joined.error_code, joined.generation_id, joined.protocol_name) == (ErrorCode.none, 1, "range")
    assert joined.leader == joined.member_id
    assert [(m.member_id, m.metadata) for m in joined.members] == [(joined.member_id, b"subscription")]
    synced = sync(client, "g", 1, joined.member_id, assignments={joined.member_id: b"partitions"})
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"partitions")
    assert heartbeat(client, "g", 1, joined.member_id) == ErrorCode.none

    described = describe(client, "g")
    assert (described.group_state, described.protocol_type, described.protocol_data) == (
        "Stable",
        "consumer",
        "range",
    )
    (member,) = described.members
    assert (member.member_id, member.client_id) == (joined.member_id, "wire-test")
    assert (member.member_metadata, member.member_assignment) == (b"subscription", b"partitions")
    # Before v4 there is no member-id round trip.
    assert join(client, "old", version=3).error_code == ErrorCode.none


def test_requests_the_coordinator_refuses(client: WireClient) -> None:
    assert join(client, "").error_code == ErrorCode.invalid_group_id
    assert sync(client, "", 1, "m").error_code == ErrorCode.invalid_group_id
    assert heartbeat(client, "", 1, "m") == ErrorCode.invalid_group_id
    assert client.request(13, 1, group_id="", member_id="m").error_code == ErrorCode.invalid_group_id
    assert join(client, "g", session_ms=10).error_code == ErrorCode.invalid_session_timeout
    assert join(client, "g", session_ms=3_600_000).error_code == ErrorCode.invalid_session_timeout
    # A member id the coordinator never gave out.
    assert join(client, "missing", "made-up").error_code == ErrorCode.unknown_member_id
    assert heartbeat(client, "missing", 1, "made-up") == ErrorCode.unknown_member_id
    assert sync(client, "missing", 1, "made-up").error_code == ErrorCode.unknown_member_id

    member_id, generation = _stable_member(client, "g")
    assert heartbeat(client, "g", generation, "made-up") == ErrorCode.unknown_member_id
    assert heartbeat(client, "g", generation - 1, member_id) == ErrorCode.illegal_generation
    assert sync(client, "g", generation + 1, member_id).error_code == ErrorCode.illegal_generation
    # Joining needs the group's protocol type and a protocol every member supports.
    other_type = join_new(client, "g", protocol_type="connect")
    assert other_type.error_code == ErrorCode.inconsistent_group_protocol
    no_common = join_new(client, "g", protocols=(("roundrobin", b""),))
    assert no_common.error_code == ErrorCode.inconsistent_group_protocol
    assert join(client, "g", member_id, protocols=()).error_code == ErrorCode.inconsistent_group_protocol


def test_a_rebalance_waits_for_every_member_and_the_leader_assigns(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as a, WireClient(broker.bootstrap_servers) as b:
        member_a, generation = _stable_member(a, "g", protocols=(("range", b"a"),))
        b_joining = send_join(b, "g", join(b, "g").member_id, protocols=(("range", b"b"),))
        # The group now waits for A: its heartbeat says so, and its commits still count.
        wait_until(lambda: heartbeat(a, "g", generation, member_a) == ErrorCode.rebalance_in_progress)
        assert commit(a, "g", {(TOPIC, 0): 5}, generation, member_a) == {(TOPIC, 0): ErrorCode.none}
        assert describe(a, "g").group_state == "PreparingRebalance"

        a_joined = join(a, "g", member_a, protocols=(("range", b"a"),))
        b_joined = b_joining.result()
        assert a_joined.generation_id == b_joined.generation_id == generation + 1
        assert a_joined.leader == b_joined.leader == member_a
        assert sorted((m.member_id, m.metadata) for m in a_joined.members) == sorted(
            [(member_a, b"a"), (b_joined.member_id, b"b")]
        )
        assert b_joined.members == ()
        assert describe(a, "g").group_state == "CompletingRebalance"
        # Between JoinGroup and SyncGroup a member cannot commit yet.
        assert commit(b, "g", {(TOPIC, 0): 6}, generation + 1, b_joined.member_id) == {
            (TOPIC, 0): ErrorCode.rebalance_in_progress
        }
        assert heartbeat(b, "g", generation, b_joined.member_id) == ErrorCode.illegal_generation

        b_syncing = send_sync(b, "g", generation + 1, b_joined.member_id)
        assignments = {member_a: b"for a", b_joined.member_id: b"for b"}
        assert sync(a, "g", generation + 1, member_a, assignments=assignments).assignment == b"for a"
        assert b_syncing.result().assignment == b"for b"
        assert describe(a, "g").group_state == "Stable"


def test_a_second_join_on_one_connection_answers_the_first(broker: EmbeddedBroker) -> None:
    """Answers go out in request order, so a superseded JoinGroup must not wait forever."""
    with WireClient(broker.bootstrap_servers) as a, WireClient(broker.bootstrap_servers) as c:
        member_a, member_c, generation = _two_member_group(a, c)
        with WireClient(broker.bootstrap_servers) as b:
            b_joining = send_join(b, "g", join(b, "g").member_id)
            # C has not rejoined yet, so A's JoinGroup waits, and A sends it again.
            first = send_join(a, "g", member_a)
            second = send_join(a, "g", member_a)
            assert first.result().error_code == ErrorCode.rebalance_in_progress
            c_joined = join(c, "g", member_c)
            assert second.result().generation_id == c_joined.generation_id == generation + 1
            assert b_joining.result().generation_id == generation + 1


def test_the_rebalance_timeout_removes_members_that_do_not_rejoin(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as a, WireClient(broker.bootstrap_servers) as b:
        member_a, member_b, generation = _two_member_group(a, b, rebalance_ms=300)
        # The leader rejoins; B neither rejoins nor heartbeats (its session is 10 s).
        started = time.monotonic()
        rejoined = join(a, "g", member_a, rebalance_ms=300)
        assert 0.25 < time.monotonic() - started < 5
        assert rejoined.generation_id == generation + 1
        assert [m.member_id for m in rejoined.members] == [member_a]
        assert heartbeat(b, "g", generation, member_b) == ErrorCode.unknown_member_id


def test_a_silent_member_is_removed_when_its_session_times_out(client: WireClient) -> None:
    # The heartbeat restarts the session after `started`, so the session cannot end sooner
    # than 300 ms after it, however slow the machine. A machine slow enough to let the session
    # end between the join and that heartbeat gets another group: the test needs a live member.
    for attempt in range(5):
        group = f"g-{attempt}"
        member_id, generation = _stable_member(client, group, session_ms=300)
        started = time.monotonic()
        if heartbeat(client, group, generation, member_id) == ErrorCode.none:
            break
    else:
        raise AssertionError("no member lived until its first heartbeat in 5 tries")
    wait_until(lambda: describe(client, group).group_state == "Empty", timeout_s=10)
    assert 0.3 <= time.monotonic() - started < 5
    assert heartbeat(client, group, generation, member_id) == ErrorCode.unknown_member_id


def test_sessions_time_out_on_time(broker: EmbeddedBroker, client: WireClient) -> None:
    """A group can be deleted right after its static member's session passed: the broker times
    sessions out at their deadline, not at its next look at the clock (it used to look every
    100 ms, so a delete just after the deadline got NON_EMPTY_GROUP)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.list_topics(timeout=10)  # connected before the timing starts
    # A session long enough that the join, sync and first heartbeat fit in it on a loaded
    # machine; the margin after its deadline stays well under the old 100 ms look.
    session_ms, margin_ms = 1000, 30
    for attempt in range(5):
        group = f"static-{attempt}"
        member_id, generation = _stable_member(client, group, instance_id="s", session_ms=session_ms)
        assert heartbeat(client, group, generation, member_id, "s") == ErrorCode.none
        # The session restarted at the latest now; this test is about time, so it sleeps.
        time.sleep((session_ms + margin_ms) / 1000)
        admin.delete_consumer_groups([group])[group].result(timeout=10)


def test_followers_are_not_left_waiting_when_the_leader_never_syncs(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as a, WireClient(broker.bootstrap_servers) as b:
        member_a, member_b, generation = _two_member_group(a, b, rebalance_ms=300)
        # B's subscription changed, so it rejoins; a follower with no change would not rebalance.
        b_joining = send_join(b, "g", member_b, rebalance_ms=300, protocols=(("range", b"changed"),))
        join(a, "g", member_a, rebalance_ms=300)
        assert b_joining.result().generation_id == generation + 1
        # B waits for an assignment that the leader (A) never sends.
        waiting = send_sync(b, "g", generation + 1, member_b)
        assert waiting.result().error_code == ErrorCode.rebalance_in_progress
        assert heartbeat(a, "g", generation + 1, member_a) == ErrorCode.unknown_member_id


def test_a_restarted_static_member_takes_its_place_without_a_rebalance(broker: EmbeddedBroker) -> None:
    with WireClient(broker.bootstrap_servers) as a, WireClient(broker.bootstrap_servers) as b:
        old_a, member_b, generation = _two_member_group(a, b, instance_ids=("a", "b"))
        # "a" restarts: a new connection, no member id, the same group.instance.id.
        with WireClient(broker.bootstrap_servers) as restarted:
            rejoined = join(restarted, "g", instance_id="a")
            assert rejoined.error_code == ErrorCode.none
            assert rejoined.generation_id == generation
            assert rejoined.member_id != old_a and rejoined.members == ()
            assert rejoined.leader == old_a  # not the new id: it must not reassign
            resynced = sync(restarted, "g", generation, rejoined.member_id, instance_id="a")
            assert resynced.assignment == b"partitions of a"
            assert heartbeat(b, "g", generation, member_b, "b") == ErrorCode.none
            # The old incarnation is fenced.
            assert heartbeat(a, "g", generation, old_a, "a") == ErrorCode.fenced_instance_id
            assert commit(a, "g", {(TOPIC, 0): 1}, generation, old_a, "a") == {
                (TOPIC, 0): ErrorCode.fenced_instance_id
            }
            assert join(a, "g", old_a, instance_id="a").error_code == ErrorCode.fenced_instance_id
            # An admin removes a static member by its instance id alone.
            left = restarted.request(
                13, 5, group_id="g", members=[{"member_id": "", "group_instance_id": "a"}]
            )
            assert [m.error_code for m in left.members] == [ErrorCode.none]
            assert heartbeat(b, "g", generation, member_b, "b") == ErrorCode.rebalance_in_progress


def test_leave_group(client: WireClient) -> None:
    left = client.request(13, 0, group_id="g", member_id="nobody")
    assert left.error_code == ErrorCode.unknown_member_id
    member_id, _ = _stable_member(client, "g")
    assert client.request(13, 0, group_id="g", member_id=member_id).error_code == ErrorCode.none
    assert describe(client, "g").group_state == "Empty"
    other_id, _ = _stable_member(client, "g")
    left = client.request(
        13,
        4,
        group_id="g",
        members=[
            {"member_id": other_id, "group_instance_id": None},
            {"member_id": "x", "group_instance_id": None},
        ],
    )
    assert left.error_code == ErrorCode.none
    assert [m.error_code for m in left.members] == [ErrorCode.none, ErrorCode.unknown_member_id]


def test_committed_offsets(client: WireClient) -> None:
    p0, p1 = (TOPIC, 0), (TOPIC, 1)
    # A group no member ever joined takes "simple" commits (generation -1, no member).
    assert commit(client, "simple", {p0: 42}) == {p0: ErrorCode.none}
    assert fetch(client, "simple", [p0, p1]) == {p0: (42, ErrorCode.none), p1: (-1, ErrorCode.none)}
    assert fetch(client, "simple", None) == {p0: (42, ErrorCode.none)}
    assert fetch(client, "nobody", [p0]) == {p0: (-1, ErrorCode.none)}
    assert commit(client, "simple", {("missing", 0): 1, (TOPIC, 7): 1, p1: 3}) == {
        ("missing", 0): ErrorCode.unknown_topic_or_partition,
        (TOPIC, 7): ErrorCode.unknown_topic_or_partition,
        p1: ErrorCode.none,
    }
    assert commit(client, "never-joined", {p0: 1}, generation=3, member_id="m") == {
        p0: ErrorCode.illegal_generation
    }
    # The oldest version clients use, and the metadata limit.
    assert commit(client, "simple", {p0: 43}, version=2) == {p0: ErrorCode.none}
    response = client.request(
        8,
        8,
        group_id="simple",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            {
                "name": TOPIC,
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": 1,
                        "committed_leader_epoch": 3,
                        "committed_metadata": "x" * 5000,
                    },
                    {
                        "partition_index": 1,
                        "committed_offset": 9,
                        "committed_leader_epoch": 3,
                        "committed_metadata": "m",
                    },
                ],
            }
        ],
    )
    assert [p.error_code for p in response.topics[0].partitions] == [
        ErrorCode.offset_metadata_too_large,
        ErrorCode.none,
    ]
    (fetched,) = client.request(
        9, 5, group_id="simple", topics=[{"name": TOPIC, "partition_indexes": [1]}]
    ).topics
    assert (fetched.partitions[0].committed_offset, fetched.partitions[0].metadata) == (9, "m")
    assert fetched.partitions[0].committed_leader_epoch == 3

    # Once the group has members, only a current member of the current generation commits.
    member_id, generation = _stable_member(client, "simple")
    assert commit(client, "simple", {p0: 50}) == {p0: ErrorCode.unknown_member_id}
    assert commit(client, "simple", {p0: 50}, generation, "stranger") == {p0: ErrorCode.unknown_member_id}
    assert commit(client, "simple", {p0: 50}, generation + 1, member_id) == {p0: ErrorCode.illegal_generation}
    assert commit(client, "simple", {p0: 50}, generation, member_id) == {p0: ErrorCode.none}

    # v8 fetches several groups at once.
    response = client.request(
        9,
        8,
        groups=[
            {"group_id": "simple", "topics": [{"name": TOPIC, "partition_indexes": [0]}]},
            {"group_id": "nobody", "topics": None},
        ],
        require_stable=False,
    )
    simple, nobody = response.groups
    assert simple.topics[0].partitions[0].committed_offset == 50
    assert (nobody.group_id, nobody.topics) == ("nobody", ())


def test_list_describe_and_delete_groups(client: WireClient) -> None:
    commit(client, "idle", {(TOPIC, 0): 7})
    _stable_member(client, "busy")
    listed = {
        g.group_id: (g.protocol_type, g.group_state, g.group_type) for g in client.request(16, 5).groups
    }
    assert listed == {"idle": ("", "Empty", "classic"), "busy": ("consumer", "Stable", "classic")}
    assert [g.group_id for g in client.request(16, 4, states_filter=["stable"]).groups] == ["busy"]
    assert client.request(16, 5, states_filter=[], types_filter=["consumer"]).groups == ()
    assert [g.group_id for g in client.request(16, 0).groups] == ["idle", "busy"]

    missing = describe(client, "missing", version=5)
    assert (missing.error_code, missing.group_state, missing.members) == (ErrorCode.none, "Dead", ())
    assert describe(client, "missing", version=6).error_code == ErrorCode.group_id_not_found
    assert describe(client, "idle").group_state == "Empty"

    response = client.request(42, 2, groups_names=["idle", "busy", "missing"])
    assert [(r.group_id, r.error_code) for r in response.results] == [
        ("idle", ErrorCode.none),
        ("busy", ErrorCode.non_empty_group),
        ("missing", ErrorCode.group_id_not_found),
    ]
    assert fetch(client, "idle", [(TOPIC, 0)]) == {(TOPIC, 0): (-1, ErrorCode.none)}
    assert [g.group_id for g in client.request(16, 3).groups] == ["busy"]


def test_transactional_offsets_stay_pending_until_the_transaction_completes(
    broker: EmbeddedBroker, client: WireClient
) -> None:
    p0 = (TOPIC, 0)
    commit(client, "g", {p0: 5})
    first, second, third = (begin_offsets_transaction(client, f"t{n}", "g") for n in range(3))
    # aiokafka sends v0, which has no member fields.
    assert txn_commit(client, "g", first, {p0: 10}, version=0) == {p0: ErrorCode.none}
    assert fetch(client, "g", [p0], require_stable=True) == {p0: (-1, ErrorCode.unstable_offset_commit)}
    assert fetch(client, "g", [p0]) == {p0: (5, ErrorCode.none)}

    async def inspect(broker: Broker) -> tuple[bool, bool, list[StagedOffset]]:
        groups = group_shard(broker, "g")
        return (
            groups.has_pending_offsets("g", TOPIC, 0),
            groups.has_pending_offsets("g", TOPIC, 1),
            groups.staged_offsets(first),
        )

    pending, other_partition, staged = on_broker_loop(broker, inspect)
    assert (pending, other_partition) == (True, False)
    assert [(s.group_id, s.partition, s.offset.offset, s.producer_epoch) for s in staged] == [
        ("g", TopicPartition(TOPIC, 0), 10, 0)
    ]

    complete_transaction(broker, "g", first, commit=True)
    assert fetch(client, "g", [p0], require_stable=True) == {p0: (10, ErrorCode.none)}
    txn_commit(client, "g", second, {p0: 20})
    complete_transaction(broker, "g", second, commit=False)
    assert fetch(client, "g", [p0], require_stable=True) == {p0: (10, ErrorCode.none)}
    # A plain commit written after the staged one wins when the transaction commits.
    txn_commit(client, "g", third, {p0: 30})
    commit(client, "g", {p0: 40})
    complete_transaction(broker, "g", third, commit=True)
    assert fetch(client, "g", [p0]) == {p0: (40, ErrorCode.none)}
    assert txn_commit(client, "", third, {p0: 1}) == {p0: ErrorCode.invalid_group_id}


def test_transactional_offsets_need_the_group_in_the_open_transaction(client: WireClient) -> None:
    p0 = (TOPIC, 0)
    assert txn_commit(client, "g", 4242, {p0: 1}) == {p0: ErrorCode.invalid_producer_id_mapping}
    producer_id = begin_offsets_transaction(client, "other-group", "h")
    assert txn_commit(client, "g", producer_id, {p0: 1}) == {p0: ErrorCode.invalid_txn_state}


def test_transactional_offsets_check_the_member_kip_447(client: WireClient) -> None:
    p0 = (TOPIC, 0)
    member_id, generation = _stable_member(client, "g", instance_id="i")
    producer = begin_offsets_transaction(client, "kip-447", "g")
    assert txn_commit(client, "g", producer, {p0: 1}, generation, member_id, "i") == {p0: ErrorCode.none}
    assert txn_commit(client, "g", producer, {p0: 1}, generation - 1, member_id, "i") == {
        p0: ErrorCode.illegal_generation
    }
    assert txn_commit(client, "g", producer, {p0: 1}, generation, "stranger") == {
        p0: ErrorCode.unknown_member_id
    }
    assert txn_commit(client, "g", producer, {p0: 1}, generation, "stranger", "i") == {
        p0: ErrorCode.fenced_instance_id
    }
    # Without generation and member the check is skipped, even though the group has members.
    assert txn_commit(client, "g", producer, {p0: 1}) == {p0: ErrorCode.none}
    assert txn_commit(client, "g", producer, {(TOPIC, 9): 1}) == {
        (TOPIC, 9): ErrorCode.unknown_topic_or_partition
    }


def test_offset_and_metadata_round_trip_in_the_coordinator(broker: EmbeddedBroker) -> None:
    """The coordinator's own interface, as the transaction coordinator and tools use it."""

    async def exercise(broker: Broker) -> list[object]:
        groups = group_shard(broker, "direct")
        partition = TopicPartition(TOPIC, 1)
        errors = groups.commit_offsets(
            "direct", -1, "", None, {partition: OffsetAndMetadata(8, 2, "meta")}, 0
        )
        return [errors, groups.fetch_offsets("direct", None, require_stable=True)]

    errors, fetched = on_broker_loop(broker, exercise)
    assert errors == {TopicPartition(TOPIC, 1): ErrorCode.none}
    assert [(f.partition, f.offset, f.error) for f in fetched] == [  # type: ignore[attr-defined]
        (TopicPartition(TOPIC, 1), OffsetAndMetadata(8, 2, "meta"), ErrorCode.none)
    ]


def test_a_transaction_whose_offsets_together_exceed_the_batch_limit_still_commits(tmp_path: Path) -> None:
    # Each TxnOffsetCommit is within max.message.bytes; the commit writes them all at once.
    partitions, metadata = 20, "m" * 4000
    with (
        EmbeddedBroker(tmp_path / "data", config={"message.max.bytes": "100000"}) as broker,
        WireClient(broker.bootstrap_servers) as client,
    ):
        assert client.create_topic(TOPIC, partitions) == ErrorCode.none
        producer_id = begin_offsets_transaction(client, "big", "g1")
        added = client.request(
            25, 3, transactional_id="big", producer_id=producer_id, producer_epoch=0, group_id="g2"
        )
        assert added.error_code == ErrorCode.none
        for group in ("g1", "g2"):
            staged = client.request(
                28,
                3,
                transactional_id="big",
                group_id=group,
                producer_id=producer_id,
                producer_epoch=0,
                generation_id=-1,
                member_id="",
                group_instance_id=None,
                topics=[
                    {
                        "name": TOPIC,
                        "partitions": [
                            {
                                "partition_index": index,
                                "committed_offset": 5,
                                "committed_leader_epoch": -1,
                                "committed_metadata": metadata,
                            }
                            for index in range(partitions)
                        ],
                    }
                ],
            )
            assert {p.error_code for t in staged.topics for p in t.partitions} == {ErrorCode.none}
        ended = client.request(
            26, 3, transactional_id="big", producer_id=producer_id, producer_epoch=0, committed=True
        )
        assert ended.error_code == ErrorCode.none
        for group in ("g1", "g2"):
            assert fetch(client, group, [(TOPIC, 0)], require_stable=True) == {
                (TOPIC, 0): (5, ErrorCode.none)
            }
