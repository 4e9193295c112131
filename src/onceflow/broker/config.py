"""Broker configuration, with Kafka's key names and defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.log.config import LogConfig

# Keys this broker understands besides the log keys LogConfig reads.
DEFAULTS: dict[str, str] = {
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
    "min.insync.replicas": "1",
    "socket.request.max.bytes": str(100 * 1024 * 1024),
    # Kafka's default is 55 MiB; a smaller one keeps the broker's memory flat when many
    # partitions are read at once, and clients simply fetch again.
    "fetch.max.bytes": str(8 * 1024 * 1024),
    "log.retention.check.interval.ms": "300000",
    "producer.id.expiration.check.interval.ms": "600000",
    # Not a Kafka key: how often producer state is snapshotted besides at segment rolls,
    # which bounds the log replay after a crash.
    "producer.snapshot.interval.ms": "60000",
    "transaction.max.timeout.ms": "900000",
    "transactional.id.expiration.ms": "604800000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000",
    "group.initial.rebalance.delay.ms": "3000",
    "group.min.session.timeout.ms": "6000",
    "group.max.session.timeout.ms": "1800000",
    "offset.metadata.max.bytes": "4096",
    # The coordinators' internal topics, with Kafka's defaults. A single broker keeps one replica
    # of each; a cluster creates them when first needed, once this many brokers are live.
    "offsets.topic.num.partitions": "50",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.segment.bytes": str(100 * 1024 * 1024),
    # How long an offset commit waits for the ISR of its partition (then COORDINATOR_NOT_AVAILABLE).
    "offsets.commit.timeout.ms": "5000",
    "transaction.state.log.num.partitions": "50",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.segment.bytes": str(100 * 1024 * 1024),
    "log.cleaner.enable": "true",
    "log.cleaner.backoff.ms": "15000",
    "cluster.id": "onceflow-cluster",
    "node.id": "0",
    "advertised.listeners": "",
    # Cluster mode (onceflow.cluster): empty means a single broker on its own.
    "zookeeper.connect": "",
    "zookeeper.session.timeout.ms": "18000",
    # How long joining waits for ZooKeeper. Kafka uses the session timeout when this is unset; here
    # it is set, so that a broker with a short session still waits for a slow ZooKeeper start.
    "zookeeper.connection.timeout.ms": "18000",
    "default.replication.factor": "1",
    "unclean.leader.election.enable": "false",
    "replica.lag.time.max.ms": "30000",
}
_BOOLEANS = {"true": True, "false": False}


class ConfigError(ValueError):
    """A configuration key or value that the broker cannot use."""


def parse_properties(text: str) -> dict[str, str]:
    """Java-style `key=value` lines; `#` and `!` start comments."""
    props: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        if not sep:
            raise ConfigError(f"line {number}: expected key=value, got {raw!r}")
        props[key.strip()] = value.strip()
    return props


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
        # Fail at start-up, not on first use.
        ints: dict[str, int] = {}
        bools: dict[str, bool] = {}
        for key in DEFAULTS:
            if key not in ("cluster.id", "advertised.listeners", "zookeeper.connect"):
                value = self.get(key)
                if value in _BOOLEANS:
                    bools[key] = _BOOLEANS[value]
                elif value.lstrip("-").isdigit():
                    ints[key] = int(value)
                else:
                    raise ConfigError(f"{key}: {value!r} is not a number or boolean")
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
                props.update(parse_properties(file.read_text()))
            except OSError as error:
                raise ConfigError(f"cannot read config file {file}: {error.strerror}") from error
        props.update(overrides or {})
        return cls(props)

    def get(self, key: str) -> str:
        return self.props.get(key, DEFAULTS.get(key, ""))

    def get_int(self, key: str) -> int:
        value = self._ints.get(key)
        return int(self.get(key)) if value is None else value

    def get_bool(self, key: str) -> bool:
        value = self._bools.get(key)
        return _BOOLEANS[self.get(key).lower()] if value is None else value

    @property
    def fetch_max_bytes(self) -> int:
        return self._ints["fetch.max.bytes"]

    def advertised_endpoint(self) -> tuple[str, int] | None:
        """Host and port from `advertised.listeners=PLAINTEXT://host:port`, if set."""
        value = self.get("advertised.listeners")
        if not value:
            return None
        _, _, address = value.split(",")[0].rpartition("://")
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"advertised.listeners: cannot read host:port from {value!r}")
        return host, int(port)

    @property
    def log_config(self) -> LogConfig:
        return self._log_config
