"""The long-running commands (demo, lab, fuzz, pipeline) refuse bad input in one line before
their minutes of work: before, a negative count ran the whole lab, a zero duration failed with
a traceback, an unwritable report path failed after the runs, and an unreachable --bootstrap
retried until killed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

UNWRITABLE = "/proc/onceflow-nowhere"
PIPELINE_RUN = ("pipeline", "run", "--bootstrap", "127.0.0.1:1", "--checkpoint", "c", "--db", "d")


def onceflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow.cli", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


# Every refused command line of the table below through the real `main`, in one process:
# (exit code, stderr) for each, as JSON.
_REFUSE_ALL = """
import contextlib, io, json, sys
from onceflow.cli import main
answers = []
for args in json.loads(sys.argv[1]):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            code = main(args)
        except SystemExit as exited:
            code = exited.code
    answers.append([code, stderr.getvalue()])
print(json.dumps(answers))
"""


REFUSED: list[tuple[tuple[str, ...], str]] = [
    (("lab", "run", "--messages", "-5"), "--messages: must be a positive integer, not -5"),
    (("lab", "run", "--seconds", "0"), "--seconds: must be a positive number, not 0"),
    (("lab", "matrix", "--seconds", "nan"), "--seconds: must be a positive number, not nan"),
    (("lab", "matrix", "--messages", "x"), "--messages: must be a positive integer, not x"),
    (("lab", "run", "--workdir", UNWRITABLE), f"--workdir: cannot make directory {UNWRITABLE}"),
    (("lab", "run", "--json", f"{UNWRITABLE}/runs.json"), f"--json: cannot make directory {UNWRITABLE}"),
    (("lab", "matrix", "--html", "/tmp"), "--html: /tmp is a directory"),
    (("lab", "broker-table", "--json", f"{UNWRITABLE}/t.json"), "--json: cannot make directory"),
    (("demo", "--report-dir", UNWRITABLE), f"--report-dir: cannot make directory {UNWRITABLE}"),
    (("fuzz", "--seconds", "-1"), "--seconds: must be a positive number, not -1"),
    (("fuzz", "--connections", "0"), "--connections: must be a positive integer, not 0"),
    (
        (*PIPELINE_RUN, "--until-idle", "0"),
        "--until-idle: must be a positive number, not 0",
    ),
    (("lab", "run", "--bootstrap", "nowhere"), "expected HOST:PORT, got 'nowhere'"),
    (
        (*PIPELINE_RUN, "--master", "bogus"),
        "--master: must be local[N], spark://HOST:PORT, k8s://... or yarn, not 'bogus'",
    ),
    (
        ("pipeline", "run", "--bootstrap", "127.0.0.1:1", "--db", "d", "--checkpoint", f"{UNWRITABLE}/c"),
        f"--checkpoint: cannot make directory {UNWRITABLE}/c",
    ),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], tuple[int, str]]:
    cwd = tmp_path_factory.mktemp("refusals")  # relative paths land there, were anything accepted
    lines = json.dumps([list(args) for args, _ in REFUSED])
    ran = subprocess.run(
        [sys.executable, "-c", _REFUSE_ALL, lines], capture_output=True, text=True, timeout=60, cwd=cwd
    )
    assert ran.returncode == 0, ran.stderr
    return {
        args: (code, stderr)
        for (args, _), (code, stderr) in zip(REFUSED, json.loads(ran.stdout), strict=True)
    }


@pytest.mark.parametrize(("args", "complaint"), REFUSED)
def test_bad_input_is_refused_in_one_line(
    refusals: dict[tuple[str, ...], tuple[int, str]], args: tuple[str, ...], complaint: str
) -> None:
    code, stderr = refusals[args]
    assert code == 2, stderr
    assert complaint in stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    "command",
    [
        ("lab", "run", "--workdir", "w"),
        ("lab", "matrix", "--workdir", "w"),
        ("demo", "--report-dir", "r"),
        ("pipeline", "run", "--checkpoint", "c", "--db", "d.sqlite"),
        ("pipeline", "generate"),
    ],
)
def test_an_unreachable_bootstrap_is_refused_before_the_run(command: tuple[str, ...], tmp_path: Path) -> None:
    # Nothing listens on port 1 of the loopback; a second address that fails too is named as well.
    refused = onceflow(*command, "--bootstrap", "127.0.0.1:1,127.0.0.1:2", cwd=tmp_path)
    assert refused.returncode == 1, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    name = "pipeline" if command[0] == "pipeline" else " ".join(command[:-2])
    assert line.startswith(f"onceflow {name}: cannot reach a broker at 127.0.0.1:1: ")
    assert "127.0.0.1:2: " in line
