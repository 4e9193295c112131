"""Java-style `.properties` files, as Kafka's broker and its tools' `--command-config` read them."""

from __future__ import annotations

from pathlib import Path


class PropertiesError(ValueError):
    """A line that is not `key=value` (or `key:value`), or a file that cannot be read."""


def parse_properties(text: str) -> dict[str, str]:
    """`key=value` lines; `#` and `!` start comments."""
    props: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        if not sep:
            raise PropertiesError(f"line {number}: expected key=value, got {raw!r}")
        props[key.strip()] = value.strip()
    return props


def read_properties(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except OSError as error:
        raise PropertiesError(f"cannot read config file {path}: {error.strerror or error}") from error
    try:
        return parse_properties(text)
    except PropertiesError as error:
        raise PropertiesError(f"{path}: {error}") from None
