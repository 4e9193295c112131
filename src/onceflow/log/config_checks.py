"""The checks every config value goes through, broker keys (`--set`, `--config`) and topic keys
(CreateTopics, AlterConfigs) alike: Kafka's ConfigDef types and validators, with Kafka's
messages, and the closest known key for an unknown one."""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable


class ConfigType(enum.IntEnum):
    """DescribeConfigs' config_type (v3+), after Kafka's ConfigDef.Type."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


def value_problem(
    config_type: ConfigType,
    raw: str,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
) -> str | None:
    """Why Kafka's ConfigDef would refuse `raw` for a key of this type and range (its message),
    or None. A list may be empty, as ValidList allows."""
    value = raw.strip()
    number: float
    if config_type in (ConfigType.INT, ConfigType.SHORT, ConfigType.LONG):
        bits = {ConfigType.INT: 31, ConfigType.SHORT: 15, ConfigType.LONG: 63}[config_type]
        try:
            number = int(value)
        except ValueError:
            return f"Not a number of type {config_type.name}"
        if not -(2**bits) <= number < 2**bits:
            return f"Not a number of type {config_type.name}"
    elif config_type is ConfigType.DOUBLE:
        try:
            number = float(value)
        except ValueError:
            return "Not a number of type DOUBLE"
    elif config_type is ConfigType.BOOLEAN:
        if value.lower() not in ("true", "false"):
            return "Expected value to be either true or false"
        return None
    else:
        items = [item.strip() for item in value.split(",")] if config_type is ConfigType.LIST else [value]
        if config_type is ConfigType.LIST and items == [""]:
            items = []
        unknown = [item for item in items if choices and item not in choices]
        if unknown:
            return f"String must be one of: {', '.join(choices)}"
        return None
    if minimum is not None and number < minimum:
        return f"Value must be at least {minimum:g}"
    if maximum is not None and number > maximum:
        return f"Value must be no more than {maximum:g}"
    return None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """What follows an unknown key's message: the known key it most likely misspells, if one
    is close enough, else nothing."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {found[0]}?)" if found else ""
