"""The documentation's API table is the broker's ApiVersions answer, nothing more or less."""

from __future__ import annotations

import re
from pathlib import Path

from onceflow.apis import ADVERTISED_VERSIONS
from onceflow.server import API_NAMES

COMPATIBILITY = Path(__file__).parent.parent / "docs" / "compatibility.md"


def test_the_compatibility_table_lists_every_advertised_api_and_version() -> None:
    rows = re.findall(r"^\| (\d+) \| \w+ \| (\d+)-(\d+) \|", COMPATIBILITY.read_text(), re.MULTILINE)
    documented = {int(key): (int(low), int(high)) for key, low, high in rows}
    advertised = {key: (versions.min, versions.max) for key, versions in ADVERTISED_VERSIONS.items()}
    assert documented == advertised


def test_metrics_label_requests_with_kafkas_api_names() -> None:
    rows = re.findall(r"^\| (\d+) \| (\w+) \| \d+-\d+ \|", COMPATIBILITY.read_text(), re.MULTILINE)
    assert {int(key): name for key, name in rows} == API_NAMES


ROOT = Path(__file__).parent.parent
DESIGN = ROOT / "docs" / "design.md"
# Where code and documents may cite the design document or point at other files.
CITING_FILES = sorted(
    path
    for path in [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
        *(ROOT / "scripts").glob("*"),
        ROOT / "Makefile",
        ROOT / "pyproject.toml",
    ]
    if path.is_file() and path != Path(__file__)
)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def design_anchors() -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", DESIGN.read_text(), re.MULTILINE)
    return {github_anchor(heading) for heading in headings}


def test_every_design_reference_names_a_section_that_exists() -> None:
    anchors = design_anchors()
    broken = []
    for path in CITING_FILES:
        text = path.read_text()
        # A section is cited by its anchor (`docs/design.md#transactions`), never by a number.
        for match in re.finditer(r"design\.md(?:#([\w-]+))?(\s*(?:§|sections?\s+\d))?", text):
            anchor, numbered = match.groups()
            if numbered or (anchor is not None and anchor not in anchors):
                line = text.count("\n", 0, match.start()) + 1
                broken.append(f"{path.relative_to(ROOT)}:{line}: {text[match.start() : match.end() + 12]!r}")
        if path == DESIGN:
            links = re.findall(r"\]\(#([\w-]+)\)", text)
            broken += [f"docs/design.md: link #{anchor}" for anchor in links if anchor not in anchors]
    assert not broken, "references to missing sections of docs/design.md:\n" + "\n".join(broken)


def test_the_design_document_cites_code_that_exists() -> None:
    paths = set(re.findall(r"`((?:src|tests|docs)/[\w/.-]+\.(?:py|md))`", DESIGN.read_text()))
    assert paths, "the design document names the code it describes"
    assert sorted(path for path in paths if not (ROOT / path).is_file()) == []


def test_no_file_points_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|(?<![\w.-])shared/|(?<![\w.-])/work/|(?<![\w.])\.\./\.\./")
    found = []
    for path in CITING_FILES:
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {match.group()!r}" for match in outside.finditer(text)]
        if path.suffix == ".md":
            for target in re.findall(r"\]\(([^)#\s]+)", text):
                if re.match(r"[a-z]+:", target):
                    continue  # a URL
                resolved = (path.parent / target).resolve()
                if not resolved.is_relative_to(ROOT.resolve()) or not resolved.exists():
                    found.append(f"{path.relative_to(ROOT)}: link {target!r}")
    assert not found, "\n".join(found)
