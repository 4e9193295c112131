"""A Ctrl-C to `onceflow pipeline run` is one line and exit 130, not PySpark's chain of
tracebacks: PySpark's SIGINT handler cancels the jobs and raises KeyboardInterrupt, and the
session's shutdown raises it again against a JVM the Ctrl-C also ended. (Checked by hand
against a real run: exit 130, the line, no Python traceback.)"""

from __future__ import annotations

import argparse

import pytest

from onceflow.cli import main
from onceflow.pipeline import command


def test_an_interrupted_run_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(_args: argparse.Namespace) -> int:
        try:
            raise KeyboardInterrupt  # PySpark's handler, mid-job
        finally:
            raise KeyboardInterrupt  # again, from the session's shutdown

    monkeypatch.setattr(command, "_run", interrupted)
    code = main(["pipeline", "run", "--bootstrap", "127.0.0.1:1", "--checkpoint", "c", "--db", "d"])
    assert code == 130
    assert capsys.readouterr().err == (
        "onceflow pipeline: interrupted; run it again to resume from its checkpoint\n"
    )
