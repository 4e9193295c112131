"""The fuzzer against a SASL listener: mutated requests before authentication are never served
(only ApiVersions, SaslHandshake and SaslAuthenticate are answered) and, after it, answered or
refused without a crash or an internal error. Control: with the session check turned off (a
failpoint), the same campaign finds requests served before authentication."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.fuzz import sasl
from onceflow.fuzz.campaign import record_corpus


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    return record_corpus(tmp_path_factory.mktemp("corpus"))


def test_nothing_is_served_before_authentication_and_nothing_crashes_after(
    recorded: list[bytes], tmp_path: Path
) -> None:
    report = sasl.run(6, 11, 8, tmp_path / "work", recorded, min_sent=600)
    assert report.sent_unauthenticated > 500 and report.answered_unauthenticated > 0  # it tried
    assert report.logins > 0 and report.sent_authenticated > 500 and report.answered_authenticated > 100
    assert report.served_before_authentication == []
    assert report.crashes == 0 and report.internal_errors == 0
    assert report.clean


def test_the_campaign_finds_requests_served_before_authentication(
    recorded: list[bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_FAILPOINTS", "security.serve-before-authentication")
    report = sasl.run(3, 11, 4, tmp_path / "work", recorded)
    assert report.served_before_authentication, report
    assert not report.clean
