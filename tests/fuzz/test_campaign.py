"""A short fuzzing campaign is clean, and its detectors fire on planted bugs (negative controls)."""

from __future__ import annotations

import shutil
import socket
import struct
from pathlib import Path

import pytest

from onceflow.faults.broker_process import BrokerProcess
from onceflow.fuzz.campaign import record_corpus, run
from tests.conftest import wait_until

pytestmark = pytest.mark.soak
REGRESSIONS = Path(__file__).parent / "regressions"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    return record_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def regressions(tmp_path: Path) -> Path:
    """A copy of the saved frames, so that a campaign's findings never land in the repository."""
    return Path(shutil.copytree(REGRESSIONS, tmp_path / "regressions"))


def test_real_clients_cover_at_least_twenty_api_keys(recorded: list[bytes]) -> None:
    assert len({struct.unpack_from(">h", frame)[0] for frame in recorded}) >= 20


def test_a_short_campaign_finds_nothing_and_the_data_survives(
    recorded: list[bytes], regressions: Path, tmp_path: Path
) -> None:
    # On a loaded machine it runs past its 12 s until it has sent as many (833 in 12 s, once).
    report = run(12, 7, 16, tmp_path / "work", regressions, recorded, min_sent=2_000)
    assert report.requests_sent >= 2_000
    assert report.requests_by_mutation["record_batch"] > 50  # batches that lie inside, CRC right
    assert len(report.requests_by_api_key) >= 20
    assert report.responses > 0 and report.connections_closed_by_broker > 0
    assert report.crashes == 0 and report.internal_errors == 0, report.findings
    # A loaded machine delays probes (4.7 s twice in a row once, in a suite's first minute): what
    # a wait for a CPU does not explain is a held loop, a finding.
    assert report.clean and report.slowest_probe_held_s < 5 and report.rss_growth_mb < 256
    assert report.sentinel_records == 300
    assert report.sentinel_intact and report.sentinel_intact_after_restart
    assert {path.name for path in regressions.glob("*.hex")} == {
        path.name for path in REGRESSIONS.glob("*.hex")
    }


def test_a_crash_is_found_and_narrowed_to_the_frame_that_causes_it(
    recorded: list[bytes], regressions: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The planted bug: the broker hands frames to kio's native reader unchecked.
    monkeypatch.setenv("ONCEFLOW_FAILPOINTS", "protocol.no-bounds-check")
    for saved in regressions.glob("*.hex"):
        saved.unlink()
    shutil.copy(REGRESSIONS / "crash-api9-offset-fetch-v8.hex", regressions)
    report = run(8, 3, 8, tmp_path / "work", regressions, recorded)
    assert report.crashes >= 1
    crashes = [finding for finding in report.findings if finding.kind == "crash" and finding.frame_hex]
    assert crashes, report.findings
    # The frame it saved kills an unguarded broker on its own.
    culprit = bytes.fromhex(Path(crashes[0].saved_as).read_text().strip())
    victim = BrokerProcess(tmp_path / "victim", {}, tmp_path / "victim.log").start()
    try:
        with socket.create_connection(("127.0.0.1", victim.port), timeout=10) as sock:
            sock.sendall(struct.pack(">i", len(culprit)) + culprit)
        assert victim.process is not None
        wait_until(lambda: victim.process is not None and victim.process.poll() is not None, 30)
    finally:
        victim.kill()
    assert report.sentinel_intact and report.sentinel_intact_after_restart


def test_an_internal_error_and_a_held_event_loop_are_found(
    recorded: list[bytes], regressions: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The planted bugs: the DescribeConfigs handler raises, the DescribeGroups one holds the loop.
    monkeypatch.setenv("ONCEFLOW_FAILPOINTS", "api.raise.32,api.block.15")
    # Every recorded frame goes out once first: the planted DescribeConfigs bug is reached even on
    # a loaded machine (random mutations alone once sent none that decoded in 10 s).
    report = run(10, 5, 8, tmp_path / "work", regressions, recorded, replay_first=True)
    assert report.requests_by_mutation["none"] > 0  # the replay happened
    assert report.internal_errors >= 1
    found = [finding for finding in report.findings if finding.kind == "internal-error"]
    assert found and found[0].api_key == 32 and "failpoint api.raise.32" in found[0].detail
    assert Path(found[0].saved_as).parent == regressions
    assert [finding.kind for finding in report.findings].count("blocked") == 1, report.findings
    assert report.slowest_probe_s > 1 and not report.clean
