"""The parts of replication that need no cluster: the leader's view of its followers, emptying a
replica's log, and the leader epoch stamped on a batch."""

from __future__ import annotations

from pathlib import Path

from onceflow.broker.replication import LeaderState
from onceflow.log.batch import batch_crc_matches, parse_batch_header, patch_partition_leader_epoch
from onceflow.log.config import LogConfig
from onceflow.log.manager import LogManager
from tests.log.batches import make_batch
from tests.log.helpers import append


def test_a_follower_is_caught_up_when_it_fetches_at_the_leaders_end() -> None:
    state = LeaderState(leader_epoch=3, started_ms=1_000)
    state.fetched(2, fetch_offset=5, leader_log_end=10, now_ms=2_000)  # behind
    state.fetched(3, fetch_offset=10, leader_log_end=10, now_ms=2_000)  # caught up
    assert state.log_end == {2: 5, 3: 10}
    # Follower 2 last caught up when the leadership began; 4 never fetched at all.
    assert state.lagging((1, 2, 3, 4), leader_id=1, lag_ms=500, now_ms=2_400) == [2, 4]
    assert state.lagging((1, 2, 3, 4), leader_id=1, lag_ms=500, now_ms=1_400) == []


def test_resetting_a_partition_empties_it_for_good_and_leaves_the_others(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, LogConfig(), 0)
    logs.create_topic("t", 2, {})
    for partition in (0, 1):
        log = logs.get("t", partition)
        assert log is not None
        append(log, make_batch(3))
        log.flush()
    fresh = logs.reset_partition("t", 0)
    assert fresh.log_end_offset == 0 and logs.get("t", 0) is fresh
    logs.close()
    reopened = LogManager(tmp_path, LogConfig(), 0)
    first, second = reopened.get("t", 0), reopened.get("t", 1)
    assert first is not None and second is not None
    assert (first.log_end_offset, second.log_end_offset) == (0, 3)
    reopened.close()


def test_the_leader_epoch_is_stamped_outside_the_crc() -> None:
    batch = make_batch(2)
    patch_partition_leader_epoch(batch, 0, 7)
    header = parse_batch_header(batch)
    assert header.partition_leader_epoch == 7
    assert batch_crc_matches(batch, 0, header)
