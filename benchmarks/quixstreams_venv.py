"""`.venv-quixstreams`: the venv of the spark benchmark's quixstreams reference, made on demand.

Every quixstreams 3.x needs confluent-kafka<2.13, below the project's pin, so quixstreams cannot
join the project's venv. The benchmark makes this one at the repository root (git-ignored) from
`quixstreams-requirements.txt` and remakes it when that file changes.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from processes import BENCHMARKS_DIR

REQUIREMENTS = BENCHMARKS_DIR / "quixstreams-requirements.txt"
VENV_DIR = BENCHMARKS_DIR.parent / ".venv-quixstreams"
VENV_PYTHON = VENV_DIR / "bin" / "python"
QUIXSTREAMS_VERSION = next(
    line.partition("==")[2].strip()
    for line in REQUIREMENTS.read_text().splitlines()
    if line.lower().startswith("quixstreams==")
)
# Written last, so a venv whose install failed halfway is made again next time.
_STAMP = VENV_DIR / "requirements.sha256"
_INSTALL_TIMEOUT_S = 900.0


class VenvUnavailable(RuntimeError):
    """The venv could not be made (no network, no index): the quixstreams row is skipped."""


def quixstreams_python(log_path: Path) -> Path:
    """The venv's interpreter, after making the venv if it is missing or out of date."""
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if VENV_PYTHON.exists() and _STAMP.exists() and _STAMP.read_text().strip() == wanted:
        return VENV_PYTHON
    shutil.rmtree(VENV_DIR, ignore_errors=True)
    with log_path.open("w") as log:
        steps = {
            f"python -m venv {VENV_DIR.name}": [sys.executable, "-m", "venv", str(VENV_DIR)],
            f"pip install -r {REQUIREMENTS.name}": [
                str(VENV_PYTHON),
                *("-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)),
            ],
        }
        for step, argv in steps.items():
            try:
                finished = subprocess.run(
                    argv, stdout=log, stderr=subprocess.STDOUT, timeout=_INSTALL_TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                raise VenvUnavailable(f"{step} took over {_INSTALL_TIMEOUT_S:.0f} s") from None
            if finished.returncode != 0:
                raise VenvUnavailable(f"{step} failed: {_last_error(log_path)}")
    _STAMP.write_text(wanted + "\n")
    return VENV_PYTHON


def _last_error(log_path: Path) -> str:
    """pip's last line that says ERROR, else its last line: the reason, for the results table."""
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]
