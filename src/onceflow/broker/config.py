"""Broker configuration, with Kafka's key names and defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.broker.config_keys import (
    BROKER_KEYS,
    SYNONYMS,
    BrokerConfigError,
    Use,
    validate_broker_configs,
    without_effect,
)
from onceflow.log.config import LogConfig
from onceflow.log.config_checks import ConfigType
from onceflow.properties import PropertiesError, read_properties

# The applied broker keys and their defaults (Kafka's, but where config_keys.py says otherwise).
DEFAULTS: dict[str, str] = {
    key.name: key.default
    for key in BROKER_KEYS.values()
    if key.use is Use.APPLIED and key.default is not None
}
_BOOLEANS = {"true": True, "false": False}


class ConfigError(ValueError):
    """A configuration key or value that the broker cannot use."""


def parse_assignments(pairs: Iterable[str]) -> dict[str, str]:
    props: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {pair!r}")
        props[key.strip()] = value.strip()
    return props


@dataclass(frozen=True)
class BrokerConfig:
    props: Mapping[str, str] = field(default_factory=dict)
    # Every value parsed once, at start-up: requests read typed values, never strings.
    _ints: dict[str, int] = field(init=False, repr=False, compare=False)
    _bools: dict[str, bool] = field(init=False, repr=False, compare=False)
    _log_config: LogConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Fail at start-up, not on first use: unknown keys, and values Kafka would refuse.
        try:
            validate_broker_configs(self.props)
        except BrokerConfigError as error:
            raise ConfigError(str(error)) from None
        ints: dict[str, int] = {}
        bools: dict[str, bool] = {}
        for key in DEFAULTS:
            config_type = BROKER_KEYS[key].type
            if config_type is ConfigType.BOOLEAN:
                bools[key] = _BOOLEANS[self.get(key).strip().lower()]
            elif config_type in (ConfigType.SHORT, ConfigType.INT, ConfigType.LONG):
                ints[key] = int(self.get(key))
        try:
            log_config = LogConfig.from_kafka(self.props)
        except ValueError as error:
            raise ConfigError(str(error)) from error
        object.__setattr__(self, "_ints", ints)
        object.__setattr__(self, "_bools", bools)
        object.__setattr__(self, "_log_config", log_config)

    @classmethod
    def load(cls, file: Path | None = None, overrides: Mapping[str, str] | None = None) -> BrokerConfig:
        props: dict[str, str] = {}
        if file is not None:
            try:
                props.update(read_properties(file))
            except PropertiesError as error:
                raise ConfigError(str(error)) from None
        props.update(overrides or {})
        return cls(props)

    def get(self, key: str) -> str:
        synonym = SYNONYMS.get(key)
        if key not in self.props and synonym is not None and synonym in self.props:
            return self.props[synonym]
        return self.props.get(key, DEFAULTS.get(key, ""))

    def without_effect(self) -> list[str]:
        """A warning for each key given that this broker accepts but does not act on."""
        return without_effect(self.props)

    def get_int(self, key: str) -> int:
        value = self._ints.get(key)
        return int(self.get(key)) if value is None else value

    def get_bool(self, key: str) -> bool:
        value = self._bools.get(key)
        return _BOOLEANS[self.get(key).lower()] if value is None else value

    @property
    def fetch_max_bytes(self) -> int:
        return self._ints["fetch.max.bytes"]

    @property
    def log_config(self) -> LogConfig:
        return self._log_config
