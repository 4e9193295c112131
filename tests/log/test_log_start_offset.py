"""The log start offset that DeleteRecords moves: durable, never moved back, and the segments
wholly below it deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.log.errors import LogReadError
from onceflow.log.log import LOG_START_OFFSET_FILE
from tests.log.batches import make_batch
from tests.log.helpers import append, open_log, read_all, segment_files


def test_the_start_moves_forward_only_and_survives_reopening(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    for _ in range(8):
        append(log, make_batch(1, value_size=60))
    bases = [int(path.stem) for path in segment_files(tmp_path)]
    assert bases == [0, 2, 4, 6]

    assert log.delete_records_before(5) == 5
    assert [int(path.stem) for path in segment_files(tmp_path)] == [4, 6]
    assert (tmp_path / LOG_START_OFFSET_FILE).read_text() == "5\n"
    assert log.delete_records_before(3) == 5  # never back
    with pytest.raises(LogReadError):
        log.read(4, 1000)
    assert read_all(log)[0].base_offset == 5
    log.flush()
    log.close()  # a crash would leave the same files: the start was fsynced when it moved

    reopened = open_log(tmp_path, segment_bytes=300)
    assert reopened.log_start_offset == 5
    assert reopened.delete_records_before(100) == 8  # at most the end of the log
    assert [int(path.stem) for path in segment_files(tmp_path)] == [6]
    reopened.close()
