"""The broker's security: each listener's TLS context and SASL mechanisms, the SCRAM
credentials, the authorizer (None without `authorizer.class.name`: everything is allowed, as
before), and how this broker logs in to others. ACLs and credentials are kept in the data
directory, or in ZooKeeper in a cluster (`cluster.security_zk`); a change is durable there
before it is acknowledged and applied."""

from __future__ import annotations

import asyncio
import secrets
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from onceflow.broker.config import BrokerConfig, ConfigError
from onceflow.broker.config_keys import JAAS_SUFFIX
from onceflow.broker.listeners import Listener, listener_setting
from onceflow.security.acls import AclBinding, AclFilter
from onceflow.security.authorizer import Authorizer, parse_super_users
from onceflow.security.jaas import JaasError, parse_jaas
from onceflow.security.plain import PlainServer
from onceflow.security.principal import ANONYMOUS, MappingRuleError, PrincipalMapper, subject_name
from onceflow.security.scram import HASHES, ScramCredential, ScramServer
from onceflow.security.session import Mechanism, Session
from onceflow.security.store import Credentials, SecurityFiles
from onceflow.security.tls import TlsConfigError, client_context, server_context


class SecurityStore(Protocol):
    """Where ACLs and credentials are kept: the data directory, or ZooKeeper."""

    async def save_acls(self, bindings: tuple[AclBinding, ...]) -> None: ...

    async def save_credentials(self, users: Credentials, changed: set[str]) -> None: ...


@dataclass(frozen=True)
class ListenerSecurity:
    listener: Listener
    ssl_context: ssl.SSLContext | None
    mechanisms: Mapping[str, Callable[[], Mechanism]] | None  # SASL listeners
    reauth_ms: int
    max_receive_bytes: int  # the largest frame before authentication
    principals: PrincipalMapper

    def session(self, host: str, peer_certificate: dict[str, Any] | None) -> Session:
        principal = ANONYMOUS
        if peer_certificate and not self.listener.sasl:
            principal = self.principals.principal(subject_name(peer_certificate))
        return Session(host, self.listener.name, principal, self.mechanisms, self.reauth_ms)


@dataclass(frozen=True)
class ClientSecurity:
    """How this broker connects to another's inter-broker listener."""

    ssl_context: ssl.SSLContext | None
    mechanism: str | None  # SASL
    username: str = ""
    password: str = ""


class BrokerSecurity:
    def __init__(self, config: BrokerConfig, data_dir: Path) -> None:
        self._config = config
        self.files = SecurityFiles(data_dir)
        self.store: SecurityStore = _FileStore(self.files)
        self.credentials: Credentials = self.files.load_credentials()
        self.authorizer: Authorizer | None = None
        if config.get("authorizer.class.name"):
            self.authorizer = Authorizer(
                parse_super_users(config.get("super.users")),
                config.get_bool("allow.everyone.if.no.acl.found"),
                self.files.load_acls(),
            )
        # Salts for users that do not exist, the same for a name as long as the broker runs.
        self._unknown_user_secret = secrets.token_bytes(32)
        self._lock: asyncio.Lock | None = None

    # -- listeners ---------------------------------------------------------------------------
    def listener(self, listener: Listener) -> ListenerSecurity:
        def setting(key: str) -> str:
            return listener_setting(self._config, listener.name, key)

        try:
            context = server_context(setting) if listener.tls else None
            principals = PrincipalMapper(setting("ssl.principal.mapping.rules"))
        except (TlsConfigError, MappingRuleError) as error:
            raise ConfigError(f"listener {listener.name}: {error}") from None
        mechanisms = None
        if listener.sasl:
            mechanisms = {
                name: self._mechanism(listener, name)
                for name in (item.strip() for item in setting("sasl.enabled.mechanisms").split(","))
                if name
            }
        return ListenerSecurity(
            listener,
            context,
            mechanisms,
            int(setting("connections.max.reauth.ms")),
            int(setting("sasl.server.max.receive.size")),
            principals,
        )

    def _mechanism(self, listener: Listener, name: str) -> Callable[[], Mechanism]:
        if name == "PLAIN":
            users = self._jaas(listener, name).plain_users
            return lambda: PlainServer(users)
        return lambda: ScramServer(
            name, lambda user: self.scram_credential(user, name), self._unknown_user_secret
        )

    def _jaas(self, listener: Listener, mechanism: str) -> Any:
        key = f"listener.name.{listener.name.lower()}.{mechanism.lower()}{JAAS_SUFFIX}"
        text = self._config.props.get(key) or self._config.props.get("sasl.jaas.config")
        if not text:
            raise ConfigError(f"listener {listener.name} has {mechanism} enabled but no {key}")
        try:
            return parse_jaas(text)
        except JaasError as error:
            raise ConfigError(f"{key}: {error}") from None

    def inter_broker_client(self, listener: Listener) -> ClientSecurity:
        def setting(key: str) -> str:
            return listener_setting(self._config, listener.name, key)

        try:
            context = client_context(setting) if listener.tls else None
        except TlsConfigError as error:
            raise ConfigError(f"inter-broker listener {listener.name}: {error}") from None
        if not listener.sasl:
            return ClientSecurity(context, None)
        mechanism = self._config.get("sasl.mechanism.inter.broker.protocol")
        if mechanism not in ("PLAIN", *HASHES):
            raise ConfigError(
                f"sasl.mechanism.inter.broker.protocol={mechanism}: the inter-broker listener "
                f"{listener.name} is SASL (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
            )
        login = self._jaas(listener, mechanism).login
        if login is None:
            raise ConfigError(
                f"listener {listener.name}: its {mechanism} JAAS config needs username and password "
                "for the brokers to log in to each other"
            )
        return ClientSecurity(context, mechanism, *login)

    # -- SCRAM credentials -------------------------------------------------------------------
    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.credentials.get(user, {}).get(mechanism)

    async def alter_credentials(
        self, upserts: Mapping[tuple[str, str], ScramCredential], deletions: Iterable[tuple[str, str]]
    ) -> None:
        async with self._mutex():
            users = {name: dict(creds) for name, creds in self.credentials.items()}
            changed = set()
            for (name, mechanism), credential in upserts.items():
                users.setdefault(name, {})[mechanism] = credential
                changed.add(name)
            for name, mechanism in deletions:
                users.get(name, {}).pop(mechanism, None)
                changed.add(name)
            users = {name: creds for name, creds in users.items() if creds}
            await self.store.save_credentials(users, changed)
            self.credentials = users

    def replace_credentials(self, users: Credentials) -> None:
        """The store's credentials now (ZooKeeper changed)."""
        self.credentials = users

    # -- ACLs --------------------------------------------------------------------------------
    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        assert self.authorizer is not None
        async with self._mutex():
            updated = tuple(dict.fromkeys((*self.authorizer.bindings, *bindings)))
            if updated != self.authorizer.bindings:
                await self.store.save_acls(updated)
                self.authorizer.replace(updated)

    async def delete_acls(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """The bindings each filter deleted."""
        assert self.authorizer is not None
        async with self._mutex():
            current = self.authorizer.bindings
            matched = [[binding for binding in current if found.matches(binding)] for found in filters]
            gone = {binding for bindings in matched for binding in bindings}
            if gone:
                kept = tuple(binding for binding in current if binding not in gone)
                await self.store.save_acls(kept)
                self.authorizer.replace(kept)
            return matched

    def _mutex(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock


class _FileStore:
    def __init__(self, files: SecurityFiles) -> None:
        self._files = files

    async def save_acls(self, bindings: tuple[AclBinding, ...]) -> None:
        await asyncio.to_thread(self._files.save_acls, bindings)

    async def save_credentials(self, users: Credentials, changed: set[str]) -> None:
        await asyncio.to_thread(self._files.save_credentials, users)
