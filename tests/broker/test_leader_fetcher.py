"""A follower's fetcher against a real broker over 127.0.0.1, with no cluster: a broker alone
answers a replica's Fetch as it answers a consumer's, up to its high watermark, and that is all
a copy needs. (The cluster's own tests: tests/cluster_mode.)"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.broker.replication import FollowedPartition, LeaderFetcher
from onceflow.embedded import EmbeddedBroker
from onceflow.log.batch import validate_batches
from onceflow.log.log import PartitionLog
from tests.log.helpers import open_log
from tests.wire import WireClient, make_batch, produce

TOPIC = "copied"
ROUNDS = 3
RECORDS_PER_BATCH = 5
VALUE_BYTES = 250  # a batch is over 1 KiB
END = ROUNDS * RECORDS_PER_BATCH
COPY_TIMEOUT_S = 10


def test_one_fetcher_copies_every_partition_byte_for_byte_and_an_erring_one_waits_alone(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    on_leader = _fill(broker)
    copies = [_copy(tmp_path, partition) for partition in (0, 1)]
    missing = _copy(tmp_path, 7)  # the leader answers UNKNOWN_TOPIC_OR_PARTITION for it every time
    told: list[tuple[int, int]] = []
    fetcher = _fetcher(broker, [*copies, missing], told)
    try:
        _follow_until_copied(fetcher, copies)
        for copy in copies:
            assert _stored(copy.log) == on_leader[copy.partition]
            assert (copy.partition, END) in told  # the broker hears of each new high watermark
        # The erring partition is still followed, backing off, and nothing was written to it.
        assert missing.key in fetcher.partitions
        assert missing.retry_at > 0
        assert missing.log.log_end_offset == 0
    finally:
        for followed in [*copies, missing]:
            followed.log.close()


def test_partitions_take_turns_when_an_answer_holds_one_batch(tmp_path: Path) -> None:
    # Each answer carries the first partition's next batch and nothing else (KIP-74: only the
    # first may exceed the budget, Kafka's smallest, which a batch fills): the one that brought
    # records goes to the end of the next request.
    with EmbeddedBroker(tmp_path / "leader", config={"fetch.max.bytes": "1024"}) as broker:
        _fill(broker)
        copies = [_copy(tmp_path, partition) for partition in (0, 1)]
        told: list[tuple[int, int]] = []
        try:
            _follow_until_copied(_fetcher(broker, copies, told), copies)
        finally:
            for copy in copies:
                copy.log.close()
    assert [partition for partition, _ in told] == [0, 1] * ROUNDS


def _fill(broker: EmbeddedBroker) -> dict[int, bytes]:
    """Partitions 0 and 1 of a new topic, ROUNDS batches each: their stored bytes."""
    with WireClient(broker.bootstrap_servers) as client:
        assert client.create_topic(TOPIC, 2) == ErrorCode.none
        for round_number in range(ROUNDS):
            for partition in (0, 1):
                values = [
                    f"{partition}-{round_number}-{index}".encode().ljust(VALUE_BYTES, b".")
                    for index in range(RECORDS_PER_BATCH)
                ]
                assert produce(client, TOPIC, partition, make_batch(values)).error_code == ErrorCode.none
        return {
            partition: bytes(client.fetch({TOPIC: [partition]}).responses[0].partitions[0].records)
            for partition in (0, 1)
        }


def _copy(tmp_path: Path, partition: int) -> FollowedPartition:
    return FollowedPartition(TOPIC, partition, open_log(tmp_path / f"copy-{partition}"), 0, 0)


def _fetcher(
    broker: EmbeddedBroker, partitions: list[FollowedPartition], told: list[tuple[int, int]]
) -> LeaderFetcher:
    return LeaderFetcher(
        9,
        ("127.0.0.1", broker.port),
        partitions,
        lambda _topic, partition, _log, high_watermark: told.append((partition, high_watermark)),
        lambda: None,
    )


def _follow_until_copied(fetcher: LeaderFetcher, copies: list[FollowedPartition]) -> None:
    async def follow() -> None:
        following = asyncio.create_task(fetcher.run())
        try:
            while not all(copy.log.log_end_offset == END for copy in copies):
                await asyncio.sleep(0.01)
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following

    asyncio.run(asyncio.wait_for(follow(), COPY_TIMEOUT_S))


def _stored(partition_log: PartitionLog) -> bytes:
    return bytes(partition_log.read_batches(0, 1 << 20).records)


def test_a_cut_is_reported_before_anything_is_appended_after_it(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    # The broker writes its recovery checkpoint when told: before the appends that follow a cut,
    # which a crash would otherwise trust unchecked, as below a recovery point they never reached.
    # And the high watermark it learned goes down with the log: as leader, it would count from it.
    _fill(broker)  # END records on the leader
    copy = _copy(tmp_path, 0)
    longer = make_batch([f"diverged-{index}".encode() for index in range(END + 2)])
    copy.log.append(longer, validate_batches(longer), 0, leader_epoch=0)  # past the leader's end
    events: list[tuple[str, int, int]] = []
    fetcher = LeaderFetcher(
        9,
        ("127.0.0.1", broker.port),
        [copy],
        lambda _topic, _partition, log, high_watermark: events.append(
            ("appended", log.log_end_offset, high_watermark)
        ),
        lambda: events.append(("cut", copy.log.log_end_offset, copy.log.flushed_offset)),
    )
    try:
        _follow_until_copied(fetcher, [copy])
    finally:
        copy.log.close()
    # A leader alone answers no epoch, so the copy is cut at its high watermark (0, at the start
    # of the divergent batch); the high watermark and the recovery point reported before the copy.
    assert events[:2] == [("appended", 0, 0), ("cut", 0, 0)]
    assert events[-1] == ("appended", END, END)
