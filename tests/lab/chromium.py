"""Headless Chromium for the report tests: render a page, read the title its self-check sets."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="scripts/setup.sh installs chromium")


def chromium(
    tmp_path: Path, page: Path, *mode: str, width: int = 1400, height: int = 900
) -> subprocess.CompletedProcess[str]:
    """Chromium on `page` in a window `width` px wide (the reports must fit 1,400 px); a
    screenshot shows `height` px of the page."""
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            f"--window-size={width},{height}",
            "--hide-scrollbars",
            *mode,
            f"file://{page}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def rendered_title(tmp_path: Path, page: Path, width: int = 1400) -> str:
    """The page's title once its scripts ran: the report's self-check writes its verdict there."""
    dom = chromium(tmp_path, page, "--dump-dom", width=width).stdout
    return dom.split("<title>", 1)[1].split("</title>", 1)[0]
