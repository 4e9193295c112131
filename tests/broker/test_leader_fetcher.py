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
from onceflow.log.log import PartitionLog
from tests.log.helpers import open_log
from tests.wire import WireClient, make_batch, produce

ROUNDS = 3
RECORDS_PER_BATCH = 5
COPY_TIMEOUT_S = 10


def test_one_fetcher_copies_every_partition_byte_for_byte_and_an_erring_one_waits_alone(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    with WireClient(broker.bootstrap_servers) as client:
        assert client.create_topic("copied", 2) == ErrorCode.none
        for round_number in range(ROUNDS):
            for partition in (0, 1):
                values = [
                    f"{partition}-{round_number}-{index}".encode() for index in range(RECORDS_PER_BATCH)
                ]
                assert produce(client, "copied", partition, make_batch(values)).error_code == ErrorCode.none
        on_leader = {
            partition: bytes(client.fetch({"copied": [partition]}).responses[0].partitions[0].records)
            for partition in (0, 1)
        }
    copies = [
        FollowedPartition("copied", partition, open_log(tmp_path / f"copy-{partition}"), 0, 0)
        for partition in (0, 1)
    ]
    # The leader has no partition 7: it answers UNKNOWN_TOPIC_OR_PARTITION for it in every fetch.
    missing = FollowedPartition("copied", 7, open_log(tmp_path / "copy-7"), 0, 0)
    told: list[tuple[int, int]] = []
    fetcher = LeaderFetcher(
        9,
        ("127.0.0.1", broker.port),
        [*copies, missing],
        lambda _topic, partition, _log, high_watermark: told.append((partition, high_watermark)),
    )
    end = ROUNDS * RECORDS_PER_BATCH

    async def follow_until_copied() -> None:
        following = asyncio.create_task(fetcher.run())
        try:
            while not all(copy.log.log_end_offset == end for copy in copies):
                await asyncio.sleep(0.01)
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following

    try:
        asyncio.run(asyncio.wait_for(follow_until_copied(), COPY_TIMEOUT_S))
        for copy in copies:
            assert _stored(copy.log) == on_leader[copy.partition]
            assert (copy.partition, end) in told  # the broker hears of each new high watermark
        # The erring partition is still followed, backing off, and nothing was written to it.
        assert missing.key in fetcher.partitions
        assert missing.retry_at > 0
        assert missing.log.log_end_offset == 0
    finally:
        for followed in [*copies, missing]:
            followed.log.close()


def _stored(partition_log: PartitionLog) -> bytes:
    return partition_log.read_batches(0, 1 << 20).records
