"""The broker's security: each listener's TLS context and SASL mechanisms, the SCRAM
credentials, the authorizer (None without `authorizer.class.name`: everything is allowed, as
before), and how this broker logs in to others. ACLs and credentials are kept in the data
directory, or in ZooKeeper in a cluster (`cluster.security_zk`, which every broker follows); a
change is durable there before it is acknowledged and applied."""

from __future__ import annotations

import asyncio
import secrets
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from onceflow.broker.config import BrokerConfig, ConfigError
from onceflow.broker.config_keys import JAAS_SUFFIX
from onceflow.broker.listeners import Listener, listener_setting
from onceflow.security.acls import AclBinding, AclFilter
from onceflow.security.authorizer import Authorizer, parse_super_users
from onceflow.security.changes import (
    Credentials,
    CredentialUpserts,
    with_acls,
    with_credentials,
    without_acls,
)
from onceflow.security.jaas import JaasError, parse_jaas
from onceflow.security.plain import PlainServer
from onceflow.security.principal import ANONYMOUS, MappingRuleError, PrincipalMapper, subject_name
from onceflow.security.scram import HASHES, ScramCredential, ScramServer
from onceflow.security.session import Mechanism, Session
from onceflow.security.store import SecurityFiles
from onceflow.security.tls import TlsConfigError, client_context, server_context

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from onceflow.cluster.security_zk import ZooKeeperSecurity


class SecurityStore(Protocol):
    """Where ACLs and credentials are kept: the data directory, or ZooKeeper. A change is
    durable there, and applied to the broker's authorizer and credentials, when it returns."""

    async def create_acls(self, bindings: Sequence[AclBinding]) -> None: ...

    async def delete_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]: ...

    async def alter_credentials(
        self, upserts: CredentialUpserts, deletions: Sequence[tuple[str, str]]
    ) -> None: ...


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
        # In a cluster the store is ZooKeeper's, from `use_zookeeper` on; until then no ACL
        # or credential is known, and only super users are allowed.
        clustered = bool(config.get("zookeeper.connect"))
        files = SecurityFiles(data_dir)
        self.store: SecurityStore = _FileStore(files, self)
        self.credentials: Credentials = {} if clustered else files.load_credentials()
        self.authorizer: Authorizer | None = None
        if config.get("authorizer.class.name"):
            self.authorizer = Authorizer(
                parse_super_users(config.get("super.users")),
                config.get_bool("allow.everyone.if.no.acl.found"),
                None if clustered else files.load_acls(),
            )
        self._zookeeper: ZooKeeperSecurity | None = None
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

    # -- the store -----------------------------------------------------------------------
    async def use_zookeeper(self, client: KazooClient) -> None:
        """Keep ACLs and credentials in the cluster's ZooKeeper (read once before this returns)."""
        from onceflow.cluster.security_zk import ZooKeeperSecurity

        zookeeper = ZooKeeperSecurity(client, self.replace_acls, self.replace_credentials)
        await zookeeper.start()
        self._zookeeper = zookeeper
        self.store = zookeeper

    async def close(self) -> None:
        if self._zookeeper is not None:
            await self._zookeeper.stop()

    def replace_acls(self, bindings: Iterable[AclBinding]) -> None:
        """The store's ACLs now."""
        if self.authorizer is not None:
            self.authorizer.replace(bindings)

    def replace_credentials(self, users: Credentials) -> None:
        """The store's credentials now."""
        self.credentials = users

    # -- SCRAM credentials -------------------------------------------------------------------
    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.credentials.get(user, {}).get(mechanism)

    async def alter_credentials(
        self, upserts: CredentialUpserts, deletions: Sequence[tuple[str, str]]
    ) -> None:
        async with self._mutex():
            await self.store.alter_credentials(upserts, deletions)

    # -- ACLs --------------------------------------------------------------------------------
    async def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        assert self.authorizer is not None
        async with self._mutex():
            await self.store.create_acls(bindings)

    async def delete_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """The bindings each filter deleted."""
        assert self.authorizer is not None
        async with self._mutex():
            return await self.store.delete_acls(filters)

    def _mutex(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock


class _FileStore:
    """The data directory's files, for a broker on its own: each change replaces a whole file."""

    def __init__(self, files: SecurityFiles, security: BrokerSecurity) -> None:
        self._files = files
        self._security = security

    async def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        authorizer = self._security.authorizer
        assert authorizer is not None
        updated = with_acls(authorizer.bindings, bindings)
        if updated != authorizer.bindings:
            await asyncio.to_thread(self._files.save_acls, updated)
            authorizer.replace(updated)

    async def delete_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        authorizer = self._security.authorizer
        assert authorizer is not None
        kept, matched = without_acls(authorizer.bindings, filters)
        if kept != authorizer.bindings:
            await asyncio.to_thread(self._files.save_acls, kept)
            authorizer.replace(kept)
        return matched

    async def alter_credentials(
        self, upserts: CredentialUpserts, deletions: Sequence[tuple[str, str]]
    ) -> None:
        current = self._security.credentials
        users = {
            user: with_credentials(user, current.get(user, {}), upserts, deletions)
            for user in {*current, *(name for name, _ in (*upserts, *deletions))}
        }
        users = {user: credentials for user, credentials in users.items() if credentials}
        await asyncio.to_thread(self._files.save_credentials, users)
        self._security.replace_credentials(users)
