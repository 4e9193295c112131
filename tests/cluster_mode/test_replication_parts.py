"""The parts of replication that need no cluster: the leader's view of its followers and the
leader epoch stamped on a batch (truncation: tests/log/test_leader_epochs.py)."""

from __future__ import annotations

from onceflow.broker.replication import LeaderState
from onceflow.log.batch import batch_crc_matches, parse_batch_header, patch_partition_leader_epoch
from tests.log.batches import make_batch


def test_a_follower_is_caught_up_when_it_fetches_at_the_leaders_end() -> None:
    state = LeaderState(leader_epoch=3, started_ms=1_000)
    state.fetched(2, fetch_offset=5, leader_log_end=10, now_ms=2_000)  # behind
    state.fetched(3, fetch_offset=10, leader_log_end=10, now_ms=2_000)  # caught up
    assert state.log_end == {2: 5, 3: 10}
    # Follower 2 last caught up when the leadership began; 4 never fetched at all.
    assert state.lagging((1, 2, 3, 4), leader_id=1, lag_ms=500, now_ms=2_400) == [2, 4]
    assert state.lagging((1, 2, 3, 4), leader_id=1, lag_ms=500, now_ms=1_400) == []


def test_the_leader_epoch_is_stamped_outside_the_crc() -> None:
    batch = make_batch(2)
    patch_partition_leader_epoch(batch, 0, 7)
    header = parse_batch_header(batch)
    assert header.partition_leader_epoch == 7
    assert batch_crc_matches(batch, 0, header)
