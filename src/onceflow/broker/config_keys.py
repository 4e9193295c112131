"""Every broker config key this broker knows, with Kafka's type, default and valid range.

A key is either applied (the broker does what it says) or, for keys of Kafka's own sample
`server.properties` that mean nothing here, accepted with a warning at start-up that says what
to use instead. Any other key is refused with the closest known key, and every value is checked
as Kafka's ConfigDef checks it (`log.config_checks`), the same checks topic configs get.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from onceflow.log.config import COMPRESSION_TYPES, LogConfig
from onceflow.log.config_checks import ConfigType, did_you_mean, value_problem


class Use(enum.Enum):
    APPLIED = "applied"
    NO_EFFECT = "no effect"


@dataclass(frozen=True)
class BrokerKey:
    name: str
    type: ConfigType
    default: str | None  # None: unset unless given (then a synonym, or Kafka's rule, decides)
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    use: Use = Use.APPLIED
    instead: str = ""  # for a key without effect: what does it here

    def problem(self, value: str) -> str | None:
        return value_problem(self.type, value, self.minimum, self.maximum, self.choices)


_B, _S, _I, _L, _D, _LIST = (
    ConfigType.BOOLEAN,
    ConfigType.STRING,
    ConfigType.INT,
    ConfigType.LONG,
    ConfigType.DOUBLE,
    ConfigType.LIST,
)
_P = ConfigType.PASSWORD
_LOG = LogConfig()
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"
# Kafka's StandardAuthorizer (KRaft) and AclAuthorizer (ZooKeeper era): one authorizer here.
AUTHORIZERS = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
)
JAAS_SUFFIX = ".sasl.jaas.config"
_HOUR_MS = 3_600_000
_NO_THREADS = "one event loop and a few fsync threads serve every connection"
_NOT_REPLICATED = "share groups (KIP-932) are not implemented"


def _ignored(name: str, config_type: ConfigType, instead: str) -> BrokerKey:
    return BrokerKey(name, config_type, None, use=Use.NO_EFFECT, instead=instead)


# Keys a listener may set for itself as `listener.name.<listener>.<key>` (Kafka's listener
# overrides); its SASL users are `listener.name.<listener>.<mechanism>.sasl.jaas.config`.
LISTENER_KEYS: dict[str, BrokerKey] = {
    key.name: key
    for key in (
        BrokerKey("sasl.enabled.mechanisms", _LIST, "GSSAPI"),
        BrokerKey("sasl.jaas.config", _P, None),
        # Kafka's limit on a frame before authentication: 512 KiB.
        BrokerKey("sasl.server.max.receive.size", _I, "524288", minimum=1),
        BrokerKey("connections.max.reauth.ms", _L, "0", minimum=0),
        BrokerKey("ssl.keystore.type", _S, "JKS"),
        BrokerKey("ssl.keystore.location", _S, None),
        BrokerKey("ssl.keystore.password", _P, None),
        BrokerKey("ssl.keystore.key", _P, None),
        BrokerKey("ssl.keystore.certificate.chain", _P, None),
        BrokerKey("ssl.key.password", _P, None),
        BrokerKey("ssl.truststore.type", _S, "JKS"),
        BrokerKey("ssl.truststore.location", _S, None),
        BrokerKey("ssl.truststore.password", _P, None),
        BrokerKey("ssl.truststore.certificates", _P, None),
        BrokerKey("ssl.client.auth", _S, "none", choices=("required", "requested", "none")),
        BrokerKey("ssl.principal.mapping.rules", _S, "DEFAULT"),
        BrokerKey("ssl.enabled.protocols", _LIST, "TLSv1.2,TLSv1.3", choices=("TLSv1.2", "TLSv1.3")),
        BrokerKey("ssl.protocol", _S, "TLSv1.3"),
        BrokerKey("ssl.cipher.suites", _LIST, ""),
        BrokerKey("ssl.endpoint.identification.algorithm", _S, "https"),
    )
}

BROKER_KEYS: dict[str, BrokerKey] = {
    key.name: key
    for key in (
        BrokerKey("num.partitions", _I, "1", minimum=1),
        BrokerKey("auto.create.topics.enable", _B, "true"),
        BrokerKey("min.insync.replicas", _I, "1", minimum=1),
        BrokerKey("socket.request.max.bytes", _I, str(100 * 1024 * 1024), minimum=1),
        # Kafka's default is 55 MiB; a smaller one keeps the broker's memory flat when many
        # partitions are read at once, and clients simply fetch again.
        BrokerKey("fetch.max.bytes", _I, str(8 * 1024 * 1024), minimum=1024),
        BrokerKey("log.retention.check.interval.ms", _L, "300000", minimum=1),
        BrokerKey("producer.id.expiration.check.interval.ms", _I, "600000", minimum=1),
        # Not a Kafka key: how often producer state is snapshotted besides at segment rolls,
        # which bounds the log replay after a crash.
        BrokerKey("producer.snapshot.interval.ms", _L, "60000", minimum=1),
        BrokerKey("transaction.max.timeout.ms", _I, "900000", minimum=1),
        BrokerKey("transactional.id.expiration.ms", _I, "604800000", minimum=1),
        BrokerKey("transaction.abort.timed.out.transaction.cleanup.interval.ms", _I, "10000", minimum=1),
        BrokerKey("group.initial.rebalance.delay.ms", _I, "3000"),
        BrokerKey("group.min.session.timeout.ms", _I, "6000"),
        BrokerKey("group.max.session.timeout.ms", _I, "1800000"),
        BrokerKey("offset.metadata.max.bytes", _I, "4096"),
        # The coordinators' internal topics, with Kafka's defaults. A single broker keeps one
        # replica of each; a cluster creates them when first needed, once this many brokers live.
        BrokerKey("offsets.topic.num.partitions", _I, "50", minimum=1),
        BrokerKey("offsets.topic.replication.factor", ConfigType.SHORT, "3", minimum=1),
        # How long an offset commit waits for the ISR of its partition (then COORDINATOR_NOT_AVAILABLE).
        BrokerKey("offsets.commit.timeout.ms", _I, "5000", minimum=1),
        BrokerKey("transaction.state.log.num.partitions", _I, "50", minimum=1),
        BrokerKey("transaction.state.log.replication.factor", ConfigType.SHORT, "3", minimum=1),
        BrokerKey("transaction.state.log.min.isr", _I, "2", minimum=1),
        BrokerKey("offsets.topic.segment.bytes", _I, str(100 * 1024 * 1024), minimum=1),
        BrokerKey("transaction.state.log.segment.bytes", _I, str(100 * 1024 * 1024), minimum=1),
        BrokerKey("log.cleaner.enable", _B, "true"),
        BrokerKey("log.cleaner.backoff.ms", _L, "15000", minimum=0),
        BrokerKey("cluster.id", _S, "onceflow-cluster"),
        BrokerKey("node.id", _I, "0", minimum=0),
        BrokerKey("broker.id", _I, None, minimum=0),  # the ZooKeeper era's name of node.id
        BrokerKey("advertised.listeners", _S, ""),
        # Listeners and security (onceflow.security), with Kafka's names and defaults: without
        # `listeners`, --listen is one PLAINTEXT listener.
        BrokerKey("listeners", _S, ""),
        BrokerKey("listener.security.protocol.map", _S, DEFAULT_PROTOCOL_MAP),
        BrokerKey("inter.broker.listener.name", _S, None),
        BrokerKey("security.inter.broker.protocol", _S, "PLAINTEXT", choices=SECURITY_PROTOCOLS),
        *LISTENER_KEYS.values(),
        BrokerKey("sasl.mechanism.inter.broker.protocol", _S, "GSSAPI"),
        BrokerKey("authorizer.class.name", _S, "", choices=("", *AUTHORIZERS)),
        BrokerKey("super.users", _S, ""),
        BrokerKey("allow.everyone.if.no.acl.found", _B, "false"),
        # Cluster mode (onceflow.cluster): empty means a single broker on its own.
        BrokerKey("zookeeper.connect", _S, ""),
        BrokerKey("zookeeper.session.timeout.ms", _I, "18000"),
        # How long joining waits for ZooKeeper. Kafka uses the session timeout when this is unset;
        # here it is set, so that a broker with a short session still waits for a slow ZooKeeper.
        BrokerKey("zookeeper.connection.timeout.ms", _I, "18000"),
        BrokerKey("default.replication.factor", _I, "1"),
        BrokerKey("unclean.leader.election.enable", _B, "false"),
        BrokerKey("replica.lag.time.max.ms", _L, "30000"),
        # Connections, after Kafka's; max.connections is also held to the open-file limit's
        # headroom, so that clients never take the descriptors the logs need.
        BrokerKey("connections.max.idle.ms", _L, "600000", minimum=1),
        BrokerKey("max.connections", _I, str(2**31 - 1), minimum=0),
        BrokerKey("max.connections.per.ip", _I, str(2**31 - 1), minimum=0),
        # Kafka's default is -1, no limit; 200 MiB of large request frames held at once is two of
        # socket.request.max.bytes.
        BrokerKey("queued.max.request.bytes", _L, str(200 * 1024 * 1024)),
        # The codec batches are stored in ("producer": as sent), and the levels of recompression.
        BrokerKey("compression.type", _S, "producer", choices=COMPRESSION_TYPES),
        BrokerKey("compression.gzip.level", _I, "-1", minimum=-1, maximum=9),
        BrokerKey("compression.lz4.level", _I, "9", minimum=1, maximum=17),
        BrokerKey("compression.zstd.level", _I, "3", minimum=-131072, maximum=22),
        # The log's keys (`LogConfig`), each the default of a topic key.
        BrokerKey("log.segment.bytes", _I, str(_LOG.segment_bytes), minimum=14),
        BrokerKey("log.index.interval.bytes", _I, str(_LOG.index_interval_bytes), minimum=0),
        BrokerKey("log.roll.hours", _I, str(_LOG.segment_ms // _HOUR_MS), minimum=1),
        BrokerKey("log.roll.ms", _L, None),
        BrokerKey("log.roll.jitter.hours", _I, str(_LOG.segment_jitter_ms // _HOUR_MS), minimum=0),
        BrokerKey("log.roll.jitter.ms", _L, None),
        BrokerKey("log.retention.hours", _I, str(_LOG.retention_ms // _HOUR_MS)),
        BrokerKey("log.retention.minutes", _I, None),
        BrokerKey("log.retention.ms", _L, None),
        BrokerKey("log.retention.bytes", _L, str(_LOG.retention_bytes)),
        BrokerKey("message.max.bytes", _I, str(_LOG.max_message_bytes), minimum=0),
        BrokerKey("producer.id.expiration.ms", _I, str(_LOG.producer_id_expiration_ms), minimum=1),
        BrokerKey("log.flush.interval.ms", _L, str(_LOG.flush_interval_ms), minimum=0),
        BrokerKey("log.cleanup.policy", _LIST, _LOG.cleanup_policy, choices=("compact", "delete")),
        BrokerKey("log.cleaner.delete.retention.ms", _L, str(_LOG.delete_retention_ms), minimum=0),
        BrokerKey("log.cleaner.min.compaction.lag.ms", _L, str(_LOG.min_compaction_lag_ms), minimum=0),
        BrokerKey(
            "log.cleaner.min.cleanable.ratio", _D, str(_LOG.min_cleanable_dirty_ratio), minimum=0, maximum=1
        ),
        # Kafka's sample server.properties: accepted, warned about.
        _ignored("log.dirs", _S, "--data-dir DIR sets the data directory"),
        _ignored("log.dir", _S, "--data-dir DIR sets the data directory"),
        _ignored("controller.listener.names", _LIST, "cluster mode runs through ZooKeeper (--zookeeper)"),
        _ignored("process.roles", _LIST, "cluster mode runs through ZooKeeper (--zookeeper)"),
        _ignored("controller.quorum.voters", _LIST, "cluster mode runs through ZooKeeper (--zookeeper)"),
        _ignored(
            "controller.quorum.bootstrap.servers", _LIST, "cluster mode runs through ZooKeeper (--zookeeper)"
        ),
        _ignored("num.network.threads", _I, _NO_THREADS),
        _ignored("num.io.threads", _I, _NO_THREADS),
        _ignored("background.threads", _I, _NO_THREADS),
        _ignored("num.recovery.threads.per.data.dir", _I, _NO_THREADS),
        _ignored("socket.send.buffer.bytes", _I, "the kernel sizes socket buffers"),
        _ignored("socket.receive.buffer.bytes", _I, "the kernel sizes socket buffers"),
        _ignored("share.coordinator.state.topic.replication.factor", ConfigType.SHORT, _NOT_REPLICATED),
        _ignored("share.coordinator.state.topic.min.isr", _I, _NOT_REPLICATED),
    )
}
# Keys another key stands in for when it is not given.
SYNONYMS = {"node.id": "broker.id"}


class BrokerConfigError(ValueError):
    """A broker config key this broker does not know, or a value Kafka would refuse."""


def validate_broker_configs(props: Mapping[str, str]) -> None:
    """Raise BrokerConfigError for the first unknown key (naming the closest known one) or the
    first value of the wrong type or out of range, with Kafka's message."""
    for name, value in props.items():
        key = broker_key(name)
        if key is None:
            raise BrokerConfigError(f"unknown broker config {name}{did_you_mean(name, BROKER_KEYS)}")
        problem = key.problem(value)
        if problem is not None:
            raise BrokerConfigError(f"Invalid value {value} for configuration {name}: {problem}")


def broker_key(name: str) -> BrokerKey | None:
    """The key `name` sets: a broker key, or a listener's own (`listener.name.L.KEY`, and
    `listener.name.L.MECHANISM.sasl.jaas.config`)."""
    key = BROKER_KEYS.get(name)
    if key is not None or not name.startswith("listener.name."):
        return key
    listener, _, rest = name.removeprefix("listener.name.").partition(".")
    if not listener:
        return None
    if rest.endswith(JAAS_SUFFIX) and "." not in rest.removesuffix(JAAS_SUFFIX):
        return LISTENER_KEYS["sasl.jaas.config"]
    return LISTENER_KEYS.get(rest)


def without_effect(props: Mapping[str, str]) -> list[str]:
    """One line for each key given that means nothing to this broker, saying what does."""
    return [
        f"{name} has no effect on this broker: {BROKER_KEYS[name].instead}"
        for name in props
        if name in BROKER_KEYS and BROKER_KEYS[name].use is Use.NO_EFFECT
    ]
