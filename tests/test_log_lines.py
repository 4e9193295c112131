"""Lines the commands log say something: a reason is never empty, and the lab's progress lines
are whole lines without source columns when piped."""

from __future__ import annotations

import io

import pytest
from kazoo.exceptions import BadVersionError, NoNodeError
from rich.console import Console

from onceflow.cluster.zk import reason
from onceflow.lab.command import progress_log


def test_kazoo_errors_without_a_message_still_give_a_reason() -> None:
    assert str(BadVersionError()) == ""  # the precondition: kazoo's error says nothing itself
    assert reason(BadVersionError()) == "the znode changed since this broker read it"
    assert reason(NoNodeError()) == "the znode is gone"
    assert reason(TimeoutError()) == "TimeoutError"
    assert reason(OSError("refused")) == "refused"


def test_piped_progress_lines_are_whole_and_without_source_columns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    message = "exactly-once: broker " + "requests Produce 123, Fetch 456; " * 4
    assert len(message) > 100
    progress_log()(message)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].endswith(message) and ".py:" not in lines[0]

    # The control: rich's log, as the lab used it, wraps at 80 columns and names its caller.
    piped = io.StringIO()
    Console(file=piped).log(message)
    assert len(piped.getvalue().splitlines()) > 1 and "test_log_lines.py:" in piped.getvalue()
