"""Broker config strings are parsed once, when the config is built: requests read typed values."""

from __future__ import annotations

import pytest

from onceflow.broker.config import DEFAULTS, BrokerConfig
from onceflow.log.config import LogConfig


def test_typed_values_are_read_without_parsing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    config = BrokerConfig(
        {"fetch.max.bytes": "2000", "log.segment.bytes": "5000", "log.cleaner.enable": "false"}
    )

    def no_parsing(*args: object, **kwargs: object) -> LogConfig:
        raise AssertionError("the log config was parsed again")

    monkeypatch.setattr(LogConfig, "from_kafka", no_parsing)
    assert config.log_config.segment_bytes == 5000
    assert config.fetch_max_bytes == 2000
    assert config.get_int("fetch.max.bytes") == 2000
    assert config.get_bool("log.cleaner.enable") is False
    assert config.get_int("num.partitions") == int(DEFAULTS["num.partitions"])


def test_a_log_config_works_out_its_cleanup_policy_once() -> None:
    config = LogConfig(cleanup_policy="compact,delete")
    assert config.compact and config.delete
    assert {"compact", "delete"} <= vars(config).keys()  # cached on the instance
