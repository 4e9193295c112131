"""Listeners after Kafka's `listeners`, `advertised.listeners`, `listener.security.protocol.map`
and `inter.broker.listener.name`: each a name, a security protocol and an address; several at once
on one broker, each with its own port. Settings a listener may have of its own are read as
`listener.name.<name>.<key>` first, then as `<key>`."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.broker.config import BrokerConfig, ConfigError
from onceflow.broker.config_keys import LISTENER_KEYS, SECURITY_PROTOCOLS


@dataclass(frozen=True)
class Listener:
    name: str
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")


def _protocol_map(config: BrokerConfig) -> dict[str, str]:
    mapping = {}
    for item in config.get("listener.security.protocol.map").split(","):
        name, sep, protocol = item.strip().partition(":")
        if not sep or protocol.strip().upper() not in SECURITY_PROTOCOLS:
            raise ConfigError(f"listener.security.protocol.map: cannot read {item.strip()!r}")
        mapping[name.strip().upper()] = protocol.strip().upper()
    return mapping


def _parse(config: BrokerConfig, key: str, value: str) -> list[Listener]:
    protocols = _protocol_map(config)
    listeners: list[Listener] = []
    for item in (part.strip() for part in value.split(",") if part.strip()):
        name, sep, address = item.partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not port.isdigit() or int(port) > 65535:
            raise ConfigError(f"{key}: expected NAME://HOST:PORT, got {item!r}")
        name = name.upper()
        if name not in protocols:
            raise ConfigError(f"{key}: listener {name} is not in listener.security.protocol.map")
        if any(listener.name == name for listener in listeners):
            raise ConfigError(f"{key}: listener {name} is named twice")
        listeners.append(Listener(name, protocols[name], host.strip("[]"), int(port)))
    return listeners


def configured_listeners(config: BrokerConfig, listen: tuple[str, int] | None) -> list[Listener]:
    """The listeners to open: `listeners`, else one PLAINTEXT listener on `listen` (--listen)."""
    value = config.get("listeners")
    if value and listen is not None:
        raise ConfigError("give either --listen or the listeners key, not both")
    if not value:
        host, port = listen if listen is not None else ("127.0.0.1", 9092)
        return [Listener("PLAINTEXT", "PLAINTEXT", host, port)]
    listeners = _parse(config, "listeners", value)
    if not listeners:
        raise ConfigError("listeners: no listener given")
    for listener in listeners:
        if listener.sasl:
            mechanisms = listener_setting(config, listener.name, "sasl.enabled.mechanisms")
            unsupported = [
                name
                for name in (item.strip() for item in mechanisms.split(","))
                if name and name not in SASL_MECHANISMS
            ]
            if unsupported or not mechanisms.strip():
                raise ConfigError(
                    f"listener {listener.name}: sasl.enabled.mechanisms={mechanisms} "
                    f"(this broker has {', '.join(SASL_MECHANISMS)})"
                )
    return listeners


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def advertised(
    config: BrokerConfig, listeners: list[Listener], bound: dict[str, tuple[str, int]]
) -> dict[str, tuple[str, int]]:
    """Each listener's address as clients are told it: `advertised.listeners`, else the bound
    address (127.0.0.1 for a wildcard host)."""
    addresses = {
        listener.name: ("127.0.0.1" if host in ("", "0.0.0.0", "::") else host, port)
        for listener in listeners
        for host, port in [bound[listener.name]]
    }
    value = config.get("advertised.listeners")
    if not value:
        return addresses
    if "://" not in value.split(",")[0]:
        raise ConfigError(f"advertised.listeners: expected NAME://HOST:PORT, got {value!r}")
    for listener in _parse(config, "advertised.listeners", value):
        if listener.name not in addresses:
            raise ConfigError(f"advertised.listeners: {listener.name} is not a listener")
        port = listener.port or bound[listener.name][1]
        addresses[listener.name] = (listener.host or addresses[listener.name][0], port)
    return addresses


def inter_broker_listener(config: BrokerConfig, listeners: list[Listener]) -> Listener:
    """`inter.broker.listener.name`, else the listener of `security.inter.broker.protocol`, else
    (no listener has it) the first."""
    name = config.get("inter.broker.listener.name")
    if name:
        found = [listener for listener in listeners if listener.name == name.upper()]
        if not found:
            raise ConfigError(f"inter.broker.listener.name: {name} is not a listener")
        return found[0]
    protocol = config.get("security.inter.broker.protocol")
    return next((listener for listener in listeners if listener.protocol == protocol), listeners[0])


def listener_setting(config: BrokerConfig, listener: str, key: str) -> str:
    """`listener.name.<listener>.<key>`, else `<key>`, else its default ("" when it has none)."""
    own = config.props.get(f"listener.name.{listener.lower()}.{key}")
    if own is not None:
        return own
    if key in config.props:
        return config.props[key]
    default = LISTENER_KEYS[key].default if key in LISTENER_KEYS else None
    return config.get(key) if default is None else default
