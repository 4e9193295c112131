"""A flush that cannot open what it syncs, for want of descriptors, ran no fsync: it says so
(`SyncNotStarted`), counts nothing as flushed, and succeeds once descriptors are back. The
broker then tries it again instead of halting (tests/broker/test_partition_flushes.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.log.helpers import segment_files

REPO = Path(__file__).resolve().parents[2]

# In a process of its own: it takes every descriptor it may have.
_CHILD = """
import errno, json, os, resource, sys
from pathlib import Path
from onceflow.log.files import SyncNotStarted
from tests.log.batches import make_batch
from tests.log.helpers import append, open_log

log = open_log(Path(sys.argv[1]), segment_bytes=200)
append(log, make_batch(2))
log.flush()
while len(list(Path(sys.argv[1]).glob("*.log"))) < 2:  # a new segment: its directory entry to sync
    append(log, make_batch(2))
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
held = []
while True:
    try:
        held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as error:
        assert error.errno == errno.EMFILE, error
        break
try:
    log.flush()
    first = "flushed"
except SyncNotStarted as error:
    first = errno.errorcode[error.errno]
flushed_meanwhile = log.flushed_offset
for fd in held:
    os.close(fd)
log.flush()
print(json.dumps({"first": first, "end": log.log_end_offset, "flushed_meanwhile": flushed_meanwhile,
                  "flushed": log.flushed_offset}))
"""


def test_a_flush_without_a_descriptor_for_the_directory_syncs_nothing_and_works_later(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr
    outcome = json.loads(child.stdout)
    assert len(segment_files(tmp_path)) == 2  # the precondition: a directory entry to sync
    assert outcome["first"] == "EMFILE"
    assert outcome["flushed_meanwhile"] == 2  # the first flush's, before the new segment
    assert outcome["flushed"] == outcome["end"] > 2
