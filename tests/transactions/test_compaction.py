"""`__transaction_state` is compacted: each record is a transactional id's whole state, so the
last record of every id replays to the same coordinator."""

from __future__ import annotations

import itertools
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.coordinator.runtime import PartitionCoordinatorLog
from onceflow.coordinator.transaction import TRANSACTION_LOG_CONFIG, TransactionCoordinator
from onceflow.internal_topics import TRANSACTION_LOG
from onceflow.log.cleaner import clean_log
from onceflow.log.config import LogConfig
from onceflow.log.manager import LogManager
from tests.memory_coordinator_log import MemoryPartitions, finish

DATA = ("data", 0)


def test_a_compacted_transaction_log_replays_to_the_same_transactions(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, LogConfig(), 0)
    config = {**TRANSACTION_LOG_CONFIG, "segment.bytes": "600", "delete.retention.ms": "0"}
    logs.create_topic(TRANSACTION_LOG, 1, config)
    log = PartitionCoordinatorLog(logs.get(TRANSACTION_LOG, 0))
    partitions = MemoryPartitions([DATA])
    ids = itertools.count(1000)

    def coordinator() -> TransactionCoordinator:
        return TransactionCoordinator(log, partitions, lambda: next(ids), 900_000, 60_000)

    live = coordinator()
    for round_ in range(10):
        for tid in ("ended", "open", "expired"):
            init = live.init_producer_id(tid, 60_000, -1, -1, round_).reply
            assert live.add_partitions(tid, init.producer_id, init.producer_epoch, [DATA], round_).reply == {
                DATA: ErrorCode.none
            }
            if tid != "open" or round_ < 9:
                commit = round_ % 2 == 0
                reply = live.end_transaction(tid, init.producer_id, init.producer_epoch, commit, round_)
                assert reply.reply == ErrorCode.none
                finish(live, tid, round_)
    assert live.expire_idle_ids(10 + 60_000) == 2  # a tombstone each for the two idle ids
    assert set(live.transactions) == {"open"}
    log.partition_log.flush()
    size = log.partition_log.size_bytes
    assert clean_log(log.partition_log, 10**9, force=True) is not None
    assert log.partition_log.size_bytes < size / 2
    replayed = coordinator()
    assert {tid: m.encode() for tid, m in replayed.transactions.items()} == {
        tid: m.encode() for tid, m in live.transactions.items()
    }
    logs.close()
