"""Broker configs are checked as Kafka checks them, by the same code as topic configs: unknown keys
refused with the closest known key, values with Kafka's types and ranges, from --set and from a
properties file alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.broker.config import BrokerConfig, ConfigError
from onceflow.log.errors import InvalidConfigError
from onceflow.log.topic_configs import validate_topic_configs


@pytest.mark.parametrize(
    ("props", "message"),
    [
        (
            {"min.insync.replica": "2"},
            "unknown broker config min.insync.replica (did you mean min.insync.replicas?)",
        ),
        ({"bogus.key": "1"}, "unknown broker config bogus.key"),
        (
            {"min.insync.replicas": "0"},
            "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1",
        ),
        ({"fetch.max.bytes": "1000"}, "fetch.max.bytes: Value must be at least 1024"),
        ({"log.cleaner.min.cleanable.ratio": "2"}, "Value must be no more than 1"),
        ({"auto.create.topics.enable": "yes"}, "Expected value to be either true or false"),
        ({"log.cleanup.policy": "tidy"}, "String must be one of: compact, delete"),
        ({"num.partitions": str(2**31)}, "Not a number of type INT"),
        ({"log.roll.hours": "0"}, "log.roll.hours: Value must be at least 1"),
    ],
)
def test_bad_broker_configs_are_refused_with_kafkas_message(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        BrokerConfig(props)
    assert str(refused.value) == message or message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_bogus_key_gets_no_suggestion_and_a_near_miss_does() -> None:
    with pytest.raises(ConfigError, match=r"^unknown broker config bogus\.key$"):
        BrokerConfig({"bogus.key": "1"})
    with pytest.raises(ConfigError, match=r"did you mean log\.retention\.hours\?"):
        BrokerConfig({"log.retention.hour": "1"})


def test_the_config_file_goes_through_the_same_checks(tmp_path: Path) -> None:
    file = tmp_path / "broker.properties"
    file.write_text("num.partitions=3\nmin.insync.replica=2\n")
    with pytest.raises(ConfigError, match=r"did you mean min\.insync\.replicas"):
        BrokerConfig.load(file)
    file.write_text("num.partitions=3\nmin.insync.replicas=2\n")  # the control: fixed, it loads
    assert BrokerConfig.load(file).get_int("min.insync.replicas") == 2


def test_topic_and_broker_keys_share_the_range_check() -> None:
    """`--set min.insync.replicas=0` was accepted while the topic key was refused."""
    with pytest.raises(InvalidConfigError) as topic:
        validate_topic_configs({"min.insync.replicas": "0"})
    with pytest.raises(ConfigError) as broker:
        BrokerConfig({"min.insync.replicas": "0"})
    assert str(topic.value).split(":", 1)[1] == str(broker.value).split(":", 1)[1]
    with pytest.raises(InvalidConfigError, match=r"did you mean retention\.ms\?"):
        validate_topic_configs({"retention.msec": "1"})


def test_kafkas_sample_keys_are_accepted_with_a_warning_and_the_rest_applied() -> None:
    config = BrokerConfig(
        {"listeners": "PLAINTEXT://:9092", "num.io.threads": "8", "broker.id": "4", "log.roll.ms": "5000"}
    )
    assert config.without_effect() == [  # listeners is applied (onceflow.broker.listeners)
        "num.io.threads has no effect on this broker: one event loop and a few fsync threads serve "
        "every connection",
    ]
    assert config.get_int("node.id") == 4  # broker.id is node.id's older name
    assert config.log_config.segment_ms == 5000
    with pytest.raises(ConfigError, match=r"num\.io\.threads: Not a number"):  # still type-checked
        BrokerConfig({"num.io.threads": "many"})
