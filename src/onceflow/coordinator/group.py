"""The classic consumer-group coordinator and committed offsets, as Kafka's GroupCoordinator.

States: Empty -> PreparingRebalance -> CompletingRebalance -> Stable, back to PreparingRebalance
when membership or subscriptions change, and Empty when the last member goes. A group that does
not exist is described as Dead.

This is a state machine without I/O of its own. Time comes in as `now_ms` and through `tick`,
which the owner calls at `next_deadline_ms()`; `on_earlier_deadline` tells it of a new, earlier one.
A JoinGroup waits until the rebalance completes and a SyncGroup until the leader's assignment
arrives: each leaves a callback that the coordinator calls exactly once, at the latest when a
rebalance, session or sync timeout passes. Callbacks must not call back into the coordinator.

One coordinator per partition of `__consumer_offsets`, with the groups that `internal_topics` puts
there. Every change (offsets, staged transactional offsets and their outcome, the group after
each completed rebalance, deletions) is appended to that partition through the coordinator
runtime before it takes effect (write, then apply): offsets, transaction outcomes and deletions
are applied by the same `_apply` that replays them, and a rebalance makes a group Stable only
once its assignment is written. A failed append changes nothing and the client gets
NOT_COORDINATOR (or COORDINATOR_NOT_AVAILABLE with too few replicas in sync). Membership between
rebalances is not logged, as in Kafka's classic protocol. Callers answer only once `log` is
committed. Loading replays that log (when the broker starts, or takes over the partition's
leadership): offsets, staged offsets and the members of each group's last generation come
back; those members must heartbeat or rejoin within their session timeout, as after a Kafka
coordinator failover.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from kio.schema.errors import ErrorCode

from onceflow import failpoints
from onceflow.coordinator.group_metadata import (
    CONSUMER_PROTOCOL_TYPE,
    Group,
    GroupState,
    JoinCallback,
    JoinResult,
    Member,
    OffsetAndMetadata,
    Protocol,
    StoredOffset,
    SyncCallback,
    SyncResult,
    TopicPartition,
    select_protocol,
)
from onceflow.coordinator.group_records import (
    CoordinatorRecord,
    GroupDeleted,
    GroupStored,
    OffsetCommitted,
    OffsetCommittedInTransaction,
    OffsetRemoved,
    OffsetStaged,
    StagedOffsetRemoved,
    StoredMember,
    TransactionCompleted,
    decode,
    encode,
)
from onceflow.coordinator.group_requests import (
    FetchedOffset,
    GroupConfig,
    GroupDescription,
    GroupListing,
    JoinRequest,
    MemberDescription,
    MemberIdentity,
    StagedOffset,
    SyncRequest,
)
from onceflow.coordinator.runtime import (
    UNFENCED_MARKERS,
    CoordinatorLog,
    CoordinatorRuntime,
    DurableLog,
    run,
    write_error,
)
from onceflow.log.errors import LogAppendError, LogError

_log = logging.getLogger(__name__)

# Compacted, as in Kafka: the last record of every key is the state, so replay stays short.
CONSUMER_OFFSETS_CONFIG = {"cleanup.policy": "compact"}
# A new member cannot heartbeat while its first JoinGroup waits; Kafka bounds that wait so.
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000


class GroupCoordinator:
    def __init__(
        self,
        log: CoordinatorLog,
        has_partition: Callable[[TopicPartition], bool],
        config: GroupConfig,
        now_ms: int,
        on_earlier_deadline: Callable[[int], None] = lambda _at_ms: None,
        replay: bool = True,
    ) -> None:
        """The coordinator of `log` (a partition of `__consumer_offsets`), replayed now unless
        `replay` is False: then the caller runs `load()` before anything else. `has_partition`
        tells which partitions exist.

        `on_earlier_deadline(at_ms)` is called when a timeout earlier than every pending one is
        set, so that the owner can call `tick` on time; it must not call into the coordinator."""
        self.config = config
        self._on_earlier_deadline = on_earlier_deadline
        self._has_partition = has_partition
        self._runtime = CoordinatorRuntime(log, encode, decode, self._apply)
        self._groups: dict[str, Group] = {}
        self._groups_by_producer: dict[int, set[str]] = {}  # producers with staged offsets
        # The epoch of the transaction coordinator that last completed each producer's
        # transaction here: a marker from an older one (deposed, and late) is refused.
        self._coordinator_epochs: dict[int, int] = {}
        # (deadline, tie-breaker, group id): the group looks at its own deadlines when woken.
        self._timers: list[tuple[int, int, str]] = []
        self._timer_sequence = itertools.count()
        if replay:
            run(self.load(now_ms))

    def load(self, now_ms: int) -> Iterator[None]:
        """Replay the log, in steps (`CoordinatorRuntime.replay`); replayed members then get a
        full session to heartbeat or rejoin."""
        yield from self._runtime.replay()
        for group in self._groups.values():
            for member in group.members.values():
                self._touch(group, member, now_ms)

    def unload(self) -> None:
        """This broker stopped coordinating the partition: whoever waits in JoinGroup or
        SyncGroup hears NOT_COORDINATOR and looks the coordinator up again."""
        for group in self._groups.values():
            for member in group.members.values():
                if member.join_callback is not None:
                    _answer_join(member, JoinResult(ErrorCode.not_coordinator, member.member_id))
                if member.sync_callback is not None:
                    _answer_sync(member, SyncResult(ErrorCode.not_coordinator))
        self._timers.clear()

    @property
    def log(self) -> DurableLog:
        return self._runtime.durable_log

    # -- membership ---------------------------------------------------------------------------

    def join_group(self, join: JoinRequest, now_ms: int, respond: JoinCallback) -> None:
        if not join.group_id:
            respond(JoinResult(ErrorCode.invalid_group_id, join.member_id))
            return
        config = self.config
        if not config.min_session_timeout_ms <= join.session_timeout_ms <= config.max_session_timeout_ms:
            respond(JoinResult(ErrorCode.invalid_session_timeout, join.member_id))
            return
        group = self._groups.get(join.group_id)
        if group is None:
            if join.member_id:
                respond(JoinResult(ErrorCode.unknown_member_id, join.member_id))
                return
            group = self._groups[join.group_id] = Group(join.group_id)
        if not group.supports_protocols(join.protocol_type, join.protocols):
            respond(JoinResult(ErrorCode.inconsistent_group_protocol, join.member_id))
        elif not join.member_id:
            self._join_new_member(group, join, now_ms, respond)
        else:
            self._join_known_member(group, join, now_ms, respond)
        self._maybe_complete_join(group, now_ms)
        self._forget_if_unused(group)

    def sync_group(self, sync: SyncRequest, now_ms: int, respond: SyncCallback) -> None:
        if not sync.group_id:
            respond(SyncResult(ErrorCode.invalid_group_id))
            return
        group = self._groups.get(sync.group_id)
        if group is None:
            respond(SyncResult(ErrorCode.unknown_member_id))
            return
        error = group.validate_member(sync.member_id, sync.group_instance_id)
        if error is None and sync.generation_id != group.generation_id:
            error = ErrorCode.illegal_generation
        if error is None and (
            (sync.protocol_type is not None and sync.protocol_type != group.protocol_type)
            or (sync.protocol_name is not None and sync.protocol_name != group.protocol_name)
        ):
            error = ErrorCode.inconsistent_group_protocol
        if error is not None:
            respond(SyncResult(error))
            return
        member = group.members[sync.member_id]
        if group.state is GroupState.PREPARING_REBALANCE:
            respond(SyncResult(ErrorCode.rebalance_in_progress))
        elif group.state is GroupState.STABLE:
            self._sync_done(group, sync.member_id)
            respond(self._assignment_of(group, member))
            self._touch(group, member, now_ms)
        else:
            self._await_sync(member, respond)
            self._sync_done(group, sync.member_id)
            if sync.member_id == group.leader_id:
                self._apply_leader_assignment(group, sync.assignments, now_ms)

    def heartbeat(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int, now_ms: int
    ) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        error = group.validate_member(member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        self._touch(group, group.members[member_id], now_ms)
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave_group(
        self, group_id: str, leaving: Sequence[MemberIdentity], now_ms: int
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """The request's error, else one per leaving member. A static member can be removed
        by its group.instance.id alone (an empty member id), as admin tools do."""
        if not group_id:
            return ErrorCode.invalid_group_id, []
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id for _ in leaving]
        errors = []
        for member_id, group_instance_id in leaving:
            if member_id in group.pending_members:
                del group.pending_members[member_id]
                self._maybe_complete_join(group, now_ms)
                errors.append(ErrorCode.none)
                continue
            if not member_id and group_instance_id in group.static_members:
                member_id = group.static_members[group_instance_id]
            error = group.validate_member(member_id, group_instance_id)
            if error is None:
                self._remove_member_and_rebalance(group, group.members[member_id], now_ms)
            errors.append(error or ErrorCode.none)
        return ErrorCode.none, errors

    # -- offsets ------------------------------------------------------------------------------

    def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        now_ms: int,
    ) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit. Generation -1 with no member id is a commit from outside group
        management, accepted while the group has no members."""
        results, valid = self._check_partitions(offsets)
        group = self._groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                return results | dict.fromkeys(valid, ErrorCode.illegal_generation)
            group = self._groups[group_id] = Group(group_id)
        error = _commit_error(group, generation_id, member_id, group_instance_id, transactional=False)
        if error is None and group.state is GroupState.COMPLETING_REBALANCE:
            # A valid member commits before its SyncGroup: it has to finish the rebalance first.
            error = ErrorCode.rebalance_in_progress
        if error is None:
            if member_id in group.members:
                self._touch(group, group.members[member_id], now_ms)
            records = [OffsetCommitted(group_id, partition, offset) for partition, offset in valid.items()]
            results |= self._write_offsets(records, now_ms)
        else:
            results |= dict.fromkeys(valid, error)
        self._forget_if_unused(group)
        return results

    def commit_transactional_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        now_ms: int,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: stage offsets for `producer_id` until `complete_transaction`.

        With a generation or member id (TxnOffsetCommit v3, KIP-447) the sender must be a
        current member of that generation. The producer id and epoch are stored as given;
        checking them against the transaction is the transaction coordinator's part (see
        `staged_offsets`)."""
        if not group_id:
            return dict.fromkeys(offsets, ErrorCode.invalid_group_id)
        results, valid = self._check_partitions(offsets)
        group = self._groups.setdefault(group_id, Group(group_id))
        error = _commit_error(group, generation_id, member_id, group_instance_id, transactional=True)
        if error is None:
            records = [
                OffsetStaged(group_id, producer_id, producer_epoch, partition, offset)
                for partition, offset in valid.items()
            ]
            results |= self._write_offsets(records, now_ms)
        else:
            results |= dict.fromkeys(valid, error)
        self._forget_if_unused(group)
        return results

    def complete_transaction(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, now_ms: int
    ) -> list[DurableLog]:
        """A transaction marker for this partition: make visible (commit) or drop (abort) every
        offset `producer_id` staged here, in every group. A commit takes only what the
        transaction's own epoch staged: a zombie of an older session may have staged offsets
        after its fence, which no check stopped when its transaction coordinator is another
        broker. Returns the logs to pass to `Broker.appended` and wait on before the outcome
        counts; empty when there was nothing to write. Raises LogError when the outcome cannot
        be written, nothing changed then, so retry; TRANSACTION_COORDINATOR_FENCED when an
        older coordinator than the last one sent the marker (it lost its partition meanwhile)."""
        known = self._coordinator_epochs.get(producer_id, -1)
        if coordinator_epoch < known and not failpoints.armed(UNFENCED_MARKERS):
            raise LogAppendError(
                ErrorCode.transaction_coordinator_fenced,
                f"a marker from coordinator epoch {coordinator_epoch}, older than {known}",
            )
        staged = self._groups_by_producer.get(producer_id)
        if staged is None and coordinator_epoch == known:
            return []
        records: list[CoordinatorRecord] = [
            TransactionCompleted(producer_id, commit, True, coordinator_epoch)
        ]
        if commit:
            # Written out, not left to the staged records: compaction may drop those.
            for group_id in staged or ():
                group = self._groups[group_id]
                for partition, stored in group.pending_offsets[producer_id].items():
                    current = group.offsets.get(partition)
                    if stored.producer_epoch == producer_epoch and (
                        current is None or current.log_offset < stored.log_offset
                    ):
                        records.append(
                            OffsetCommittedInTransaction(group_id, partition, stored.value, stored.log_offset)
                        )
        self._runtime.write(records, now_ms)
        return [self.log]

    def has_pending_offsets(self, group_id: str, topic: str, partition: int) -> bool:
        """Whether a transaction has staged, but not completed, an offset for this partition."""
        group = self._groups.get(group_id)
        return group is not None and group.has_pending_offset(TopicPartition(topic, partition))

    def staged_offsets(self, producer_id: int) -> list[StagedOffset]:
        """What `producer_id` has staged, with the producer epoch each TxnOffsetCommit carried:
        for the transaction coordinator to verify against the transaction's epoch (fencing a
        zombie's offsets) and to describe open transactions."""
        staged = []
        for group_id in sorted(self._groups_by_producer.get(producer_id, ())):
            pending = self._groups[group_id].pending_offsets[producer_id]
            staged += [
                StagedOffset(group_id, partition, stored.value, stored.producer_epoch)
                for partition, stored in pending.items()
            ]
        return staged

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None, require_stable: bool
    ) -> list[FetchedOffset]:
        """Committed offsets; `partitions=None` means all of the group's. With `require_stable`,
        a partition with offsets staged by an open transaction is UNSTABLE_OFFSET_COMMIT."""
        group = self._groups.get(group_id)
        if partitions is None:
            partitions = sorted(group.offsets) if group is not None else []
        fetched = []
        for partition in partitions:
            if group is not None and require_stable and group.has_pending_offset(partition):
                fetched.append(FetchedOffset(partition, None, ErrorCode.unstable_offset_commit))
                continue
            stored = group.offsets.get(partition) if group is not None else None
            fetched.append(FetchedOffset(partition, stored.value if stored else None, ErrorCode.none))
        return fetched

    # -- administration -----------------------------------------------------------------------

    def describe_group(self, group_id: str) -> GroupDescription | None:
        """None when the group does not exist. Member metadata and assignments are given only
        while the group is Stable, as Kafka does."""
        group = self._groups.get(group_id)
        if group is None:
            return None
        protocol = group.protocol_name if group.state is GroupState.STABLE else None
        members = tuple(
            MemberDescription(
                member.member_id,
                member.group_instance_id,
                member.client_id,
                member.client_host,
                member.metadata(protocol) if protocol is not None else b"",
                member.assignment if protocol is not None else b"",
            )
            for member in group.members.values()
        )
        return GroupDescription(group_id, group.state, group.protocol_type or "", protocol or "", members)

    def list_groups(self) -> list[GroupListing]:
        return [
            GroupListing(group.group_id, group.protocol_type or "", group.state)
            for group in self._groups.values()
        ]

    def delete_groups(self, group_ids: Iterable[str], now_ms: int) -> dict[str, ErrorCode]:
        """Delete empty groups with their offsets (staged ones too). A group with members is
        NON_EMPTY_GROUP; an unknown one GROUP_ID_NOT_FOUND."""
        results: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            group = self._groups.get(group_id)
            if group is None:
                results[group_id] = ErrorCode.group_id_not_found
            elif group.state is not GroupState.EMPTY:
                results[group_id] = ErrorCode.non_empty_group
            else:
                results[group_id] = ErrorCode.none
        doomed = [group_id for group_id, error in results.items() if error is ErrorCode.none]
        if doomed:
            try:
                self._runtime.write(
                    [record for group_id in doomed for record in self._deletion(group_id)], now_ms
                )
            except LogError as failure:
                return results | dict.fromkeys(doomed, _coordinator_error(failure))
        return results

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition], now_ms: int
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete, as Kafka's coordinator: the group's error (GROUP_ID_NOT_FOUND, or
        NON_EMPTY_GROUP for an active group of another protocol type than `consumer`), else one
        per partition: GROUP_SUBSCRIBED_TO_TOPIC while a member subscribes to its topic. The
        committed offsets are deleted by tombstones in the log; staged ones stay with their
        transaction. A group left empty without offsets is gone, as in Kafka."""
        if not group_id:
            return ErrorCode.invalid_group_id, {}
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.group_id_not_found, {}
        results = dict.fromkeys(partitions, ErrorCode.none)
        if group.state is not GroupState.EMPTY:
            if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                return ErrorCode.non_empty_group, {}
            subscribed = group.subscribed_topics()
            for partition in partitions:
                if partition.topic in subscribed:
                    results[partition] = ErrorCode.group_subscribed_to_topic
        doomed = [p for p, error in results.items() if error is ErrorCode.none and p in group.offsets]
        if doomed:
            try:
                self._runtime.write([OffsetRemoved(group_id, partition) for partition in doomed], now_ms)
            except LogError as failure:
                return _coordinator_error(failure), {}
        return ErrorCode.none, results

    # -- timers -------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[DurableLog]:
        """Act on every timeout that has passed: expired sessions, rebalance and sync
        timeouts, the initial rebalance delay. Returns the logs it appended to."""
        end = self.log.log_end_offset
        due: dict[str, None] = {}
        while self._timers and self._timers[0][0] <= now_ms:
            due[heapq.heappop(self._timers)[2]] = None
        for group_id in due:
            group = self._groups.get(group_id)
            if group is not None:
                self._expire(group, now_ms)
                self._forget_if_unused(group)
        return [self.log] if self.log.log_end_offset > end else []

    def _expire(self, group: Group, now_ms: int) -> None:
        for member_id, deadline in list(group.pending_members.items()):
            if deadline <= now_ms:
                del group.pending_members[member_id]
                self._maybe_complete_join(group, now_ms)
        for member in list(group.members.values()):
            expired = member.session_deadline_ms <= now_ms and (
                member.is_new or not member.waits_for_rebalance
            )
            if expired and group.members.get(member.member_id) is member:
                _log.info("member %s of group %s timed out", member.member_id, group.group_id)
                self._remove_member_and_rebalance(group, member, now_ms)
        self._maybe_complete_join(group, now_ms)
        if group.sync_deadline_ms is not None and group.sync_deadline_ms <= now_ms:
            self._expire_pending_sync(group, now_ms)

    def _deletion(self, group_id: str) -> list[CoordinatorRecord]:
        """A tombstone for every key of the group: once compaction has dropped the group's
        tombstone, no older record of it may bring it back."""
        group = self._groups[group_id]
        records: list[CoordinatorRecord] = [OffsetRemoved(group_id, partition) for partition in group.offsets]
        records += [
            StagedOffsetRemoved(group_id, producer_id, partition)
            for producer_id, staged in group.pending_offsets.items()
            for partition in staged
        ]
        return [*records, GroupDeleted(group_id)]

    def _forget_if_unused(self, group: Group) -> None:
        """Drop a group that never completed a rebalance and holds nothing (say, created by a
        JoinGroup that failed): there is nothing to remember, and nothing was written."""
        if (
            group.state is GroupState.EMPTY
            and group.generation_id == 0
            and not (group.members or group.pending_members or group.offsets or group.pending_offsets)
        ):
            del self._groups[group.group_id]

    def next_deadline_ms(self) -> int | None:
        """When `tick` has work next (perhaps none, for a timeout that no longer applies)."""
        return self._timers[0][0] if self._timers else None

    def _wake(self, group: Group, at_ms: int) -> None:
        entry = (at_ms, next(self._timer_sequence), group.group_id)
        heapq.heappush(self._timers, entry)
        if self._timers[0] is entry:
            self._on_earlier_deadline(at_ms)

    def _touch(self, group: Group, member: Member, now_ms: int) -> None:
        """The member showed it is alive: its session starts over."""
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        self._wake(group, member.session_deadline_ms)

    # -- joining ------------------------------------------------------------------------------

    def _join_new_member(self, group: Group, join: JoinRequest, now_ms: int, respond: JoinCallback) -> None:
        instance_id = join.group_instance_id
        member_id = f"{join.client_id if instance_id is None else instance_id}-{uuid.uuid4()}"
        if instance_id is not None:
            previous_id = group.static_members.get(instance_id)
            if previous_id is None:
                self._add_member_and_rebalance(group, join, member_id, now_ms, respond)
            else:
                self._replace_static_member_and_rebalance(
                    group, join, previous_id, member_id, now_ms, respond
                )
        elif join.require_known_member_id:
            group.pending_members[member_id] = now_ms + join.session_timeout_ms
            self._wake(group, now_ms + join.session_timeout_ms)
            respond(JoinResult(ErrorCode.member_id_required, member_id))
        else:
            self._add_member_and_rebalance(group, join, member_id, now_ms, respond)

    def _join_known_member(self, group: Group, join: JoinRequest, now_ms: int, respond: JoinCallback) -> None:
        if join.member_id in group.pending_members and join.group_instance_id is None:
            self._add_member_and_rebalance(group, join, join.member_id, now_ms, respond)
            return
        error = group.validate_member(join.member_id, join.group_instance_id)
        if error is not None:
            respond(JoinResult(error, join.member_id))
            return
        member = group.members[join.member_id]
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, join, now_ms, respond)
        elif group.state is GroupState.COMPLETING_REBALANCE:
            if member.matches(join.protocols):
                # A retry of a JoinGroup whose answer was lost: answer it again.
                respond(self._join_result(group, member))
            else:
                self._update_member_and_rebalance(group, member, join, now_ms, respond)
        elif join.member_id == group.leader_id or not member.matches(join.protocols):
            # Stable: the leader rejoins to rebalance on changes the member metadata does not
            # show (new partitions, say); any member rejoins when its subscription changed.
            self._update_member_and_rebalance(group, member, join, now_ms, respond)
        else:
            respond(self._join_result(group, member, as_leader=False))

    def _add_member_and_rebalance(
        self, group: Group, join: JoinRequest, member_id: str, now_ms: int, respond: JoinCallback
    ) -> None:
        member = Member(
            member_id,
            join.group_instance_id,
            join.client_id,
            join.client_host,
            join.session_timeout_ms,
            join.rebalance_timeout_ms,
            join.protocol_type,
            join.protocols,
            is_new=True,
        )
        if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        group.add(member)
        member.join_callback = respond
        member.session_deadline_ms = now_ms + NEW_MEMBER_JOIN_TIMEOUT_MS
        self._wake(group, member.session_deadline_ms)
        self._maybe_prepare_rebalance(group, now_ms)

    def _update_member_and_rebalance(
        self, group: Group, member: Member, join: JoinRequest, now_ms: int, respond: JoinCallback
    ) -> None:
        _update_member(member, join.protocols, join.session_timeout_ms, join.rebalance_timeout_ms)
        self._await_join(member, respond)
        self._maybe_prepare_rebalance(group, now_ms)

    def _replace_static_member_and_rebalance(
        self,
        group: Group,
        join: JoinRequest,
        previous_id: str,
        member_id: str,
        now_ms: int,
        respond: JoinCallback,
    ) -> None:
        """A static member restarted (KIP-345): the new member id takes the old one's place.
        A Stable group whose protocol choice stays the same does not rebalance; the member gets
        its old assignment through SyncGroup."""
        assert join.group_instance_id is not None
        leader_id = group.leader_id
        protocols_after = [
            join.protocols if member.member_id == previous_id else member.protocols
            for member in group.members.values()
        ]
        keeps_assignment = (
            group.state is GroupState.STABLE and select_protocol(protocols_after) == group.protocol_name
        )
        if keeps_assignment:
            # Written before it takes effect: a failed write leaves the old incarnation in place.
            error = self._store_group(group, now_ms, replacing=(previous_id, member_id, join))
            if error is not None:
                respond(JoinResult(error, ""))
                return
        member = self._replace_static_member(group, join.group_instance_id, previous_id, member_id)
        _update_member(member, join.protocols, join.session_timeout_ms, join.rebalance_timeout_ms)
        self._touch(group, member, now_ms)
        if keeps_assignment:
            # The old leader id: the rejoined member must not think it leads (and reassign
            # partitions that a Stable group would not hand out).
            respond(self._join_result(group, member, as_leader=False, leader_id=leader_id))
            return
        member.join_callback = respond
        if group.state is GroupState.COMPLETING_REBALANCE:
            # The leader may have computed assignments for the old member id.
            self._prepare_rebalance(group, now_ms)
        else:
            self._maybe_prepare_rebalance(group, now_ms)

    def _replace_static_member(
        self, group: Group, group_instance_id: str, previous_id: str, member_id: str
    ) -> Member:
        member = group.members.pop(previous_id)
        # The old incarnation may still wait in JoinGroup or SyncGroup: fence it now.
        if member.join_callback is not None:
            _answer_join(member, JoinResult(ErrorCode.fenced_instance_id, previous_id))
        if member.sync_callback is not None:
            _answer_sync(member, SyncResult(ErrorCode.fenced_instance_id))
        member.member_id = member_id
        group.members[member_id] = member
        if group.leader_id == previous_id:
            group.leader_id = member_id
        group.static_members[group_instance_id] = member_id
        if previous_id in group.pending_sync:
            group.pending_sync.discard(previous_id)
            group.pending_sync.add(member_id)
        return member

    def _await_join(self, member: Member, respond: JoinCallback) -> None:
        if member.join_callback is not None:
            # A second JoinGroup while one waits (the client gave up on the first): the first
            # must still be answered, or a connection waiting in order would stall.
            _answer_join(member, JoinResult(ErrorCode.rebalance_in_progress, member.member_id))
        member.join_callback = respond

    def _await_sync(self, member: Member, respond: SyncCallback) -> None:
        if member.sync_callback is not None:
            _answer_sync(member, SyncResult(ErrorCode.rebalance_in_progress))
        member.sync_callback = respond

    # -- rebalancing --------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group, now_ms: int) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, now_ms)

    def _prepare_rebalance(self, group: Group, now_ms: int) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._fail_syncs(group, ErrorCode.rebalance_in_progress, now_ms)
        group.pending_sync.clear()
        group.sync_deadline_ms = None
        if group.state is GroupState.EMPTY:
            delay = self.config.initial_rebalance_delay_ms
            group.initial_delay_remaining_ms = max(group.rebalance_timeout_ms - delay, 0)
            group.new_member_added = False
        else:
            delay = group.rebalance_timeout_ms
            group.initial_delay_remaining_ms = None
        group.state = GroupState.PREPARING_REBALANCE
        self._set_join_deadline(group, now_ms + delay)
        self._maybe_complete_join(group, now_ms)

    def _set_join_deadline(self, group: Group, deadline_ms: int) -> None:
        group.join_deadline_ms = deadline_ms
        self._wake(group, deadline_ms)

    def _maybe_complete_join(self, group: Group, now_ms: int) -> None:
        """Complete the join phase once every member rejoined, or at the rebalance timeout.
        The first rebalance of an empty group waits out the initial delay instead, extended
        while new members keep arriving."""
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        assert group.join_deadline_ms is not None
        if group.initial_delay_remaining_ms is not None:
            if now_ms < group.join_deadline_ms:
                return
            if group.new_member_added and group.initial_delay_remaining_ms > 0:
                delay = min(self.config.initial_rebalance_delay_ms, group.initial_delay_remaining_ms)
                group.initial_delay_remaining_ms -= delay
                group.new_member_added = False
                self._set_join_deadline(group, now_ms + delay)
                return
        elif now_ms < group.join_deadline_ms and not group.all_joined():
            return
        self._complete_join(group, now_ms)

    def _complete_join(self, group: Group, now_ms: int) -> None:
        for member in list(group.members.values()):
            # Dynamic members that did not rejoin in time are out; static ones keep their
            # place until their session times out.
            if member.join_callback is None and member.group_instance_id is None:
                self._remove_member(group, member)
        group.initial_delay_remaining_ms = None
        group.new_member_added = False
        if group.members and not _elect_joined_leader(group):
            # Only static members that have not rejoined: wait for them (or their sessions).
            self._set_join_deadline(group, now_ms + group.rebalance_timeout_ms)
            return
        group.join_deadline_ms = None
        group.generation_id += 1
        if not group.members:
            group.protocol_name = None
            group.state = GroupState.EMPTY
            if (error := self._store_group(group, now_ms)) is not None:
                # Harmless: with no members, a replayed older generation just times out.
                _log.warning("cannot store empty group %s: %s", group.group_id, error.name)
            return
        group.protocol_name = group.select_protocol()
        group.state = GroupState.COMPLETING_REBALANCE
        for member in group.members.values():
            member.is_new = False
            group.pending_sync.add(member.member_id)
            if member.join_callback is not None:
                _answer_join(member, self._join_result(group, member))
            self._touch(group, member, now_ms)
        # Members that never send SyncGroup are removed at the rebalance timeout, so that
        # the rest do not wait for an assignment forever.
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms
        self._wake(group, group.sync_deadline_ms)

    def _apply_leader_assignment(self, group: Group, assignments: Mapping[str, bytes], now_ms: int) -> None:
        complete = {member_id: assignments.get(member_id, b"") for member_id in group.members}
        error = self._store_group(group, now_ms, complete)
        if error is not None:
            self._fail_syncs(group, error, now_ms)
            self._prepare_rebalance(group, now_ms)
            return
        group.state = GroupState.STABLE
        for member in group.members.values():
            member.assignment = complete[member.member_id]
            if member.sync_callback is not None:
                _answer_sync(member, self._assignment_of(group, member))
                self._touch(group, member, now_ms)

    def _fail_syncs(self, group: Group, error: ErrorCode, now_ms: int) -> None:
        for member in group.members.values():
            member.assignment = b""
            if member.sync_callback is not None:
                _answer_sync(member, SyncResult(error))
                self._touch(group, member, now_ms)

    def _sync_done(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            group.sync_deadline_ms = None

    def _expire_pending_sync(self, group: Group, now_ms: int) -> None:
        group.sync_deadline_ms = None
        if group.pending_sync and group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            _log.info("members %s of group %s sent no SyncGroup", sorted(group.pending_sync), group.group_id)
            for member_id in list(group.pending_sync):
                self._remove_member(group, group.members[member_id])
            self._prepare_rebalance(group, now_ms)

    def _remove_member_and_rebalance(self, group: Group, member: Member, now_ms: int) -> None:
        self._remove_member(group, member)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, now_ms)
        else:
            self._prepare_rebalance(group, now_ms)

    def _remove_member(self, group: Group, member: Member) -> None:
        group.remove(member.member_id)
        if member.join_callback is not None:
            _answer_join(member, JoinResult(ErrorCode.unknown_member_id, ""))
        if member.sync_callback is not None:
            _answer_sync(member, SyncResult(ErrorCode.unknown_member_id))

    def _join_result(
        self, group: Group, member: Member, as_leader: bool = True, leader_id: str | None = None
    ) -> JoinResult:
        is_leader = as_leader and member.member_id == group.leader_id
        return JoinResult(
            ErrorCode.none,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            (leader_id if leader_id is not None else group.leader_id) or "",
            group.leader_view() if is_leader else (),
        )

    @staticmethod
    def _assignment_of(group: Group, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.none, group.protocol_type, group.protocol_name, member.assignment)

    # -- the log ------------------------------------------------------------------------------

    def _check_partitions(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, OffsetAndMetadata]]:
        """Errors for partitions that cannot take a commit, and the rest."""
        errors: dict[TopicPartition, ErrorCode] = {}
        valid: dict[TopicPartition, OffsetAndMetadata] = {}
        for partition, offset in offsets.items():
            if not self._has_partition(partition):
                errors[partition] = ErrorCode.unknown_topic_or_partition
            elif len(offset.metadata.encode()) > self.config.offset_metadata_max_bytes:
                errors[partition] = ErrorCode.offset_metadata_too_large
            else:
                valid[partition] = offset
        return errors, valid

    def _write_offsets(
        self, records: Sequence[OffsetCommitted | OffsetStaged], now_ms: int
    ) -> dict[TopicPartition, ErrorCode]:
        if not records:
            return {}
        try:
            self._runtime.write(records, now_ms)
        except LogError as failure:
            return {record.partition: _coordinator_error(failure) for record in records}
        return {record.partition: ErrorCode.none for record in records}

    def _store_group(
        self,
        group: Group,
        now_ms: int,
        assignments: Mapping[str, bytes] | None = None,
        replacing: tuple[str, str, JoinRequest] | None = None,
    ) -> ErrorCode | None:
        """Write the group as it is, or as it is about to be: with these assignments, or with
        the static member `replacing` = (old member id, new member id, its JoinGroup). The
        caller applies the change only when this returns no error (the code to answer)."""
        protocol = group.protocol_name
        members = []
        # The replaced member goes last, where `_replace_static_member` puts it.
        in_order = sorted(
            group.members.values(), key=lambda m: replacing is not None and m.member_id == replacing[0]
        )
        for member in in_order:
            member_id, protocols = member.member_id, member.protocols
            session_timeout_ms, rebalance_timeout_ms = member.session_timeout_ms, member.rebalance_timeout_ms
            if replacing is not None and member_id == replacing[0]:
                _, member_id, join = replacing
                protocols = join.protocols
                session_timeout_ms, rebalance_timeout_ms = join.session_timeout_ms, join.rebalance_timeout_ms
            members.append(
                StoredMember(
                    member_id,
                    member.group_instance_id,
                    member.client_id,
                    member.client_host,
                    session_timeout_ms,
                    rebalance_timeout_ms,
                    next(p.metadata for p in protocols if p.name == protocol)
                    if protocol is not None
                    else b"",
                    member.assignment if assignments is None else assignments[member.member_id],
                )
            )
        record = GroupStored(
            group.group_id,
            group.generation_id,
            group.protocol_type,
            protocol,
            replacing[1] if replacing is not None and group.leader_id == replacing[0] else group.leader_id,
            tuple(members),
        )
        try:
            # Only appended: the live group already has what `_load_group` would rebuild from it,
            # plus what is not logged (callbacks, deadlines).
            self._runtime.append([record], now_ms)
        except LogError as failure:
            return _coordinator_error(failure)
        return None

    def _apply(self, record: CoordinatorRecord, log_offset: int) -> None:
        """Apply an offset, transaction or deletion record, written now or replayed."""
        match record:
            case OffsetCommitted(group_id, partition, offset):
                group = self._groups.setdefault(group_id, Group(group_id))
                group.offsets[partition] = StoredOffset(offset, log_offset)
            case OffsetCommittedInTransaction(group_id, partition, offset, staged_at):
                group = self._groups.setdefault(group_id, Group(group_id))
                group.offsets[partition] = StoredOffset(offset, staged_at)
            case OffsetRemoved(group_id, partition):
                emptied = self._groups.get(group_id)
                if emptied is not None:
                    emptied.offsets.pop(partition, None)
                    # OffsetDelete that leaves an empty group with nothing removes the group.
                    unused = not (emptied.pending_members or emptied.offsets or emptied.pending_offsets)
                    if emptied.state is GroupState.EMPTY and unused:
                        del self._groups[group_id]
            case StagedOffsetRemoved(group_id, producer_id, partition):
                self._remove_staged(group_id, producer_id, partition)
            case OffsetStaged(group_id, producer_id, producer_epoch, partition, offset):
                group = self._groups.setdefault(group_id, Group(group_id))
                staged = group.pending_offsets.setdefault(producer_id, {})
                staged[partition] = StoredOffset(offset, log_offset, producer_epoch)
                self._groups_by_producer.setdefault(producer_id, set()).add(group_id)
            case TransactionCompleted(producer_id, commit, offsets_logged, coordinator_epoch):
                known = self._coordinator_epochs.get(producer_id, -1)
                self._coordinator_epochs[producer_id] = max(known, coordinator_epoch)
                for group_id in self._groups_by_producer.pop(producer_id, set()):
                    group = self._groups[group_id]
                    staged = group.pending_offsets.pop(producer_id)
                    if commit and not offsets_logged:
                        for partition, stored in staged.items():
                            current = group.offsets.get(partition)
                            if current is None or current.log_offset < stored.log_offset:
                                group.offsets[partition] = stored
            case GroupDeleted(group_id):
                deleted = self._groups.pop(group_id, None)
                for producer_id in deleted.pending_offsets if deleted is not None else ():
                    producers = self._groups_by_producer[producer_id]
                    producers.discard(group_id)
                    if not producers:
                        del self._groups_by_producer[producer_id]
            case GroupStored():
                self._load_group(record)

    def _remove_staged(self, group_id: str, producer_id: int, partition: TopicPartition) -> None:
        group = self._groups.get(group_id)
        staged = group.pending_offsets.get(producer_id) if group is not None else None
        if group is None or staged is None:
            return
        staged.pop(partition, None)
        if not staged:
            del group.pending_offsets[producer_id]
            producers = self._groups_by_producer[producer_id]
            producers.discard(group_id)
            if not producers:
                del self._groups_by_producer[producer_id]

    def _load_group(self, record: GroupStored) -> None:
        group = self._groups.setdefault(record.group_id, Group(record.group_id))
        group.generation_id = record.generation_id
        group.protocol_type = record.protocol_type
        group.protocol_name = record.protocol_name
        group.members.clear()
        group.static_members.clear()
        group.leader_id = None
        for stored in record.members:
            assert record.protocol_name is not None
            group.add(
                Member(
                    stored.member_id,
                    stored.group_instance_id,
                    stored.client_id,
                    stored.client_host,
                    stored.session_timeout_ms,
                    stored.rebalance_timeout_ms,
                    record.protocol_type or "",
                    (Protocol(record.protocol_name, stored.subscription),),
                    stored.assignment,
                )
            )
        group.leader_id = record.leader_id if group.members else None
        group.state = GroupState.STABLE if group.members else GroupState.EMPTY


def _commit_error(
    group: Group, generation_id: int, member_id: str, group_instance_id: str | None, transactional: bool
) -> ErrorCode | None:
    if generation_id >= 0 or member_id or group_instance_id is not None:
        error = group.validate_member(member_id, group_instance_id)
        if error is None and generation_id != group.generation_id:
            error = ErrorCode.illegal_generation
        return error
    if not transactional and group.state is not GroupState.EMPTY:
        # Only members commit to a group with members. Transactional commits before
        # TxnOffsetCommit v3 carry no member, so they pass.
        return ErrorCode.unknown_member_id
    return None


def _elect_joined_leader(group: Group) -> bool:
    """Keep the leader if it rejoined, else pick a member that did; False if none did."""
    leader = group.members.get(group.leader_id or "")
    if leader is not None and leader.join_callback is not None:
        return True
    joined = next((m for m in group.members.values() if m.join_callback is not None), None)
    if joined is None:
        return False
    group.leader_id = joined.member_id
    return True


def _update_member(
    member: Member, protocols: tuple[Protocol, ...], session_timeout_ms: int, rebalance_timeout_ms: int
) -> None:
    member.protocols = protocols
    member.session_timeout_ms = session_timeout_ms
    member.rebalance_timeout_ms = rebalance_timeout_ms


def _answer_join(member: Member, result: JoinResult) -> None:
    callback, member.join_callback = member.join_callback, None
    assert callback is not None
    callback(result)


def _answer_sync(member: Member, result: SyncResult) -> None:
    callback, member.sync_callback = member.sync_callback, None
    assert callback is not None
    callback(result)


def _coordinator_error(failure: LogError) -> ErrorCode:
    """What a client is told when the coordinator log refuses a write, as Kafka's
    GroupMetadataManager maps it: a batch too large is INVALID_COMMIT_OFFSET_SIZE; too few
    replicas in sync COORDINATOR_NOT_AVAILABLE; anything else NOT_COORDINATOR (storage trouble,
    a lost leadership: the client looks the coordinator up again and retries)."""
    if failure.error_code in (ErrorCode.message_too_large, ErrorCode.record_list_too_large):
        return ErrorCode.invalid_commit_offset_size
    if write_error(failure.error_code) == ErrorCode.coordinator_not_available:
        return ErrorCode.coordinator_not_available
    return ErrorCode.not_coordinator
