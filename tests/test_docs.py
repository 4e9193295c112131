"""The documentation's API table is the broker's ApiVersions answer, nothing more or less."""

from __future__ import annotations

import re
from pathlib import Path

from onceflow.apis import SUPPORTED_VERSIONS
from onceflow.server import API_NAMES

COMPATIBILITY = Path(__file__).parent.parent / "docs" / "compatibility.md"


def test_the_compatibility_table_lists_every_advertised_api_and_version() -> None:
    rows = re.findall(r"^\| (\d+) \| \w+ \| (\d+)-(\d+) \|", COMPATIBILITY.read_text(), re.MULTILINE)
    documented = {int(key): (int(low), int(high)) for key, low, high in rows}
    advertised = {key: (versions.min, versions.max) for key, versions in SUPPORTED_VERSIONS.items()}
    assert documented == advertised


def test_metrics_label_requests_with_kafkas_api_names() -> None:
    rows = re.findall(r"^\| (\d+) \| (\w+) \| \d+-\d+ \|", COMPATIBILITY.read_text(), re.MULTILINE)
    assert {int(key): name for key, name in rows} == API_NAMES
