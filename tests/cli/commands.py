"""Running `onceflow` admin commands as a separate process, as an operator would."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from onceflow import EmbeddedBroker


def onceflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow.cli", *args], capture_output=True, text=True, timeout=30
    )


def admin(broker: EmbeddedBroker, *args: str) -> str:
    """Table output of a command that must succeed."""
    result = onceflow(*args, "--bootstrap", broker.bootstrap_servers)
    assert result.returncode == 0, result.stderr
    return result.stdout


def admin_json(broker: EmbeddedBroker, *args: str) -> Any:
    return json.loads(admin(broker, *args, "--json"))
