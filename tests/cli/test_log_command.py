"""`onceflow log check DIR`, and a broker that will not start on a file it cannot read: one line
that names it, nothing deleted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.commands import onceflow
from tests.log.batches import make_batch
from tests.log.helpers import append, open_log, segment_files
from tests.log.test_recovery import flip_byte, payload_byte_of


def _data_dir(tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    log = open_log(data_dir / "orders-0", segment_bytes=400)
    for _ in range(12):
        append(log, make_batch(2, value_size=40))
    log.close()
    return data_dir


def test_log_check_exits_0_on_a_healthy_directory_and_1_listing_a_corrupt_batch(tmp_path: Path) -> None:
    data_dir = _data_dir(tmp_path)
    healthy = onceflow("log", "check", str(data_dir))
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.strip().endswith("read: 0 corrupt")
    segment = segment_files(data_dir / "orders-0")[2]
    position, base_offset = payload_byte_of(segment, 0)
    flip_byte(segment, position)
    corrupt = onceflow("log", "check", str(data_dir))
    assert corrupt.returncode == 1
    assert f"orders-0 {segment.name}: bytes 0-" in corrupt.stdout
    assert f"(offsets {base_offset} to" in corrupt.stdout
    as_json = onceflow("log", "check", str(data_dir), "--json")
    (finding,) = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert (finding["topic"], finding["partition"], finding["first_offset"]) == ("orders", 0, base_offset)


def test_log_check_of_no_directory_is_one_line(tmp_path: Path) -> None:
    result = onceflow("log", "check", str(tmp_path / "nothing"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "is not a directory" in result.stderr


@pytest.mark.parametrize(
    ("file", "content", "says"),
    [
        ("topics.json", "{not json", "restore it from a backup"),
        ("recovery-point-offset-checkpoint", "0\n2\norders 0 5\n", "delete it to check every partition"),
        ("orders-0/log-start-offset", "soon\n", "delete it to serve the partition from its first segment"),
    ],
)
def test_a_broker_stops_at_an_unreadable_file_naming_it(
    tmp_path: Path, file: str, content: str, says: str
) -> None:
    data_dir = tmp_path / "data"
    started = subprocess.Popen(
        [sys.executable, "-m", "onceflow.cli", "broker", "--listen", "127.0.0.1:0", "--data-dir", data_dir],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert started.stdout is not None
    listening = started.stdout.readline()
    assert "listening on" in listening
    address = listening.rsplit(" ", 1)[1].strip()
    subprocess.run(
        [sys.executable, "-m", "onceflow.cli", "topics", "create", "orders", "--bootstrap", address],
        check=True,
        capture_output=True,
        timeout=30,
    )
    started.terminate()
    assert started.wait(30) == 0
    (data_dir / file).write_text(content)
    before = _data_files(data_dir)
    result = onceflow("broker", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert str(data_dir / file) in line and says in line
    assert _data_files(data_dir) == before  # nothing set aside, cut or deleted


def _data_files(data_dir: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in data_dir.rglob("*") if path.suffix in (".log", ".json")}
