"""The parts of replication that need no cluster: the leader epoch stamped on a batch (a leader's
view of its followers: tests/broker/test_partition.py; truncation: tests/log/test_leader_epochs.py)."""

from __future__ import annotations

from onceflow.log.batch import batch_crc_matches, parse_batch_header, patch_partition_leader_epoch
from tests.log.batches import make_batch


def test_the_leader_epoch_is_stamped_outside_the_crc() -> None:
    batch = make_batch(2)
    patch_partition_leader_epoch(batch, 0, 7)
    header = parse_batch_header(batch)
    assert header.partition_leader_epoch == 7
    assert batch_crc_matches(batch, 0, header)
