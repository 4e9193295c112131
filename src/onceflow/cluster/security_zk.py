"""A cluster's ACLs and SCRAM credentials in ZooKeeper (`cluster.security_znodes` gives the
layout), shared by every broker: a write goes to ZooKeeper, with a compare-and-set on each
znode it changes, before the broker answers; every broker watches the znodes and applies what
it reads, as brokers follow the rest of the cluster (`cluster.zk`): a watch that fires asks for
one new read of them all on a worker thread, and a burst of changes costs one read.

Reading everything again is simple and fine for the tens of ACLs and users a cluster has;
Kafka's brokers follow change-notification znodes instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from onceflow.cluster.errors import ClusterError
from onceflow.cluster.security_znodes import (
    ACL_ROOTS,
    RESOURCE_TYPE_NAMES,
    USERS,
    acl_path,
    acl_type_path,
    decode_acls,
    decode_user_config,
    encode_acls,
    encode_user_config,
    scram_credentials,
    unsegment,
    user_path,
    with_scram_credentials,
)
from onceflow.cluster.zk import RETRY_AFTER_ERROR_S, reason
from onceflow.security.acls import AclBinding, AclFilter, PatternType, ResourceType
from onceflow.security.changes import (
    Credentials,
    CredentialUpserts,
    with_acls,
    with_credentials,
    without_acls,
)

log = logging.getLogger(__name__)

# How long a write waits for this broker to read it back before answering (it is durable
# already; the read only makes the writing broker apply it at once).
READ_BACK_TIMEOUT_S = 10.0
# A connection lost during the first read (a loaded machine misses a heartbeat) is retried while
# kazoo reconnects, for as long as the session could outlive it, not fatal to the start.
FIRST_READ_DEADLINE_S = 30.0
_Pattern = tuple[PatternType, ResourceType, str]
T = TypeVar("T")


class ZooKeeperSecurity:
    def __init__(
        self,
        client: KazooClient,
        on_acls: Callable[[tuple[AclBinding, ...]], None],
        on_credentials: Callable[[Credentials], None],
    ) -> None:
        """`client`: the broker's started ZooKeeper session. `on_acls` and `on_credentials`
        run on the event loop with what ZooKeeper holds, at the start and at every change."""
        self._client = client
        self._on_acls = on_acls
        self._on_credentials = on_credentials
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._read_back: list[asyncio.Future[None]] = []  # writes waiting for a read after them
        self._follower: asyncio.Task[None] | None = None
        self._reported: dict[str, str] = {}  # bad znodes, each logged once until it changes

    async def start(self) -> None:
        """Read the ACLs and credentials once (the broker applies them before this returns),
        then follow them."""
        self._loop = asyncio.get_running_loop()
        try:
            retry = KazooRetry(max_tries=-1, max_delay=1.0, deadline=FIRST_READ_DEADLINE_S)
            acls, credentials = await asyncio.to_thread(retry, self._first_read)
        except (KazooException, KazooTimeoutError) as error:
            raise ClusterError(f"reading the ACLs and SCRAM credentials failed: {reason(error)}") from error
        self._apply(acls, credentials)
        self._client.add_listener(self._session_state_changed)
        self._follower = asyncio.create_task(self._follow(), name="cluster-security-follower")

    async def stop(self) -> None:
        self._client.remove_listener(self._session_state_changed)
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)

    # -- following ---------------------------------------------------------------------------
    def _first_read(self) -> tuple[tuple[AclBinding, ...], Credentials]:
        for pattern_type in ACL_ROOTS:
            for resource_type in RESOURCE_TYPE_NAMES:
                self._client.ensure_path(acl_type_path(pattern_type, resource_type))
        self._client.ensure_path(USERS)
        return self._read()

    def _session_state_changed(self, state: str) -> None:
        """On kazoo's thread: a session that came back may have missed changes."""
        if state == KazooState.CONNECTED:
            self._mark_changed()

    def _mark_changed(self, _event: Any = None) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._changed.set)

    async def _follow(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            waiting, self._read_back = self._read_back, []
            try:
                acls, credentials = await asyncio.to_thread(self._read)
            except (KazooException, KazooTimeoutError) as error:
                log.warning("reading the ACLs and credentials failed (%s); trying again", reason(error))
                self._read_back += waiting
                await asyncio.sleep(RETRY_AFTER_ERROR_S)
                self._changed.set()
                continue
            self._apply(acls, credentials)
            for waiter in waiting:
                if not waiter.done():
                    waiter.set_result(None)

    def _apply(self, acls: tuple[AclBinding, ...], credentials: Credentials) -> None:
        self._on_acls(acls)
        self._on_credentials(credentials)

    def _read(self) -> tuple[tuple[AclBinding, ...], Credentials]:
        """On a worker thread: every ACL and credential, watching each znode and listing."""
        acls: list[AclBinding] = []
        for _, (bindings, _version) in self._acl_znodes(self._mark_changed):
            acls += bindings
        credentials: Credentials = {}
        for child in self._children(USERS, self._mark_changed):
            name = unsegment(child)
            try:
                config = decode_user_config(self._client.get(user_path(name), watch=self._mark_changed)[0])
                found = scram_credentials(config)
            except NoNodeError:
                continue
            except ValueError as error:
                self._report(user_path(name), error)
                continue
            if found:
                credentials[name] = found
        return tuple(acls), credentials

    def _acl_znodes(
        self, watch: Callable[[Any], None] | None
    ) -> Iterable[tuple[_Pattern, tuple[list[AclBinding], int]]]:
        """Each resource pattern's ACLs and znode version."""
        for pattern_type in ACL_ROOTS:
            for resource_type in RESOURCE_TYPE_NAMES:
                for child in self._children(acl_type_path(pattern_type, resource_type), watch):
                    pattern = (pattern_type, resource_type, unsegment(child))
                    try:
                        yield pattern, self._get_acls(pattern, watch)
                    except NoNodeError:
                        continue
                    except ValueError as error:
                        self._report(acl_path(*pattern), error)

    def _report(self, path: str, error: ValueError) -> None:
        if self._reported.get(path) != str(error):
            self._reported[path] = str(error)
            log.error("ignoring %s: %s", path, error)

    def _children(self, path: str, watch: Callable[[Any], None] | None) -> list[str]:
        try:
            return sorted(self._client.get_children(path, watch=watch))
        except NoNodeError:
            return []

    def _get_acls(
        self, pattern: _Pattern, watch: Callable[[Any], None] | None = None
    ) -> tuple[list[AclBinding], int]:
        data, stat = self._client.get(acl_path(*pattern), watch=watch)
        return decode_acls(*pattern, data), stat.version

    # -- writing -----------------------------------------------------------------------------
    async def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        await self._write(self._create_acls, bindings)

    async def delete_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """The bindings each filter deleted."""
        matched: list[list[AclBinding]] = await self._write(self._delete_acls, filters)
        return matched

    async def alter_credentials(
        self, upserts: CredentialUpserts, deletions: Sequence[tuple[str, str]]
    ) -> None:
        await self._write(self._alter_credentials, upserts, deletions)

    async def _write(self, write: Callable[..., Any], *args: Any) -> Any:
        """`write` on a worker thread, then a read of everything that starts after it, which
        this broker applies before the caller answers."""
        try:
            result = await asyncio.to_thread(write, *args)
        except (KazooException, KazooTimeoutError) as error:
            raise ClusterError(f"writing to ZooKeeper failed: {reason(error)}") from error
        read_back = asyncio.get_running_loop().create_future()
        self._read_back.append(read_back)
        self._changed.set()
        try:
            await asyncio.wait_for(read_back, READ_BACK_TIMEOUT_S)
        except TimeoutError:
            log.warning("a security change is in ZooKeeper but this broker has not read it back yet")
        return result

    def _create_acls(self, bindings: Sequence[AclBinding]) -> None:
        by_pattern: dict[_Pattern, list[AclBinding]] = {}
        for binding in bindings:
            pattern = (binding.pattern_type, binding.resource_type, binding.name)
            by_pattern.setdefault(pattern, []).append(binding)
        for pattern, added in by_pattern.items():
            self._compare_and_set(acl_path(*pattern), partial(_added, pattern, added))

    def _delete_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        matched: list[list[AclBinding]] = [[] for _ in filters]
        for pattern, _ in list(self._acl_znodes(None)):
            found = self._compare_and_set(acl_path(*pattern), partial(_removed, pattern, filters))
            for index, bindings in enumerate(found):
                matched[index] += bindings
        return matched

    def _alter_credentials(self, upserts: CredentialUpserts, deletions: Sequence[tuple[str, str]]) -> None:
        for user in dict.fromkeys([name for name, _ in (*upserts, *deletions)]):
            self._compare_and_set(user_path(user), partial(_altered, user, upserts, deletions))

    def _compare_and_set(self, path: str, change: Callable[[bytes | None], tuple[bytes | None, T]]) -> T:
        """Replace the znode's data by what `change(data)` gives (None: no znode) with a
        compare-and-set on the version read, reading again when someone else wrote first;
        `change`'s other result is returned."""
        client = self._client
        while True:
            try:
                data, stat = client.get(path)
            except NoNodeError:
                data, version = None, -1
            else:
                version = stat.version
            new, result = change(data)
            try:
                if new == data:
                    pass
                elif new is None:
                    client.delete(path, version=version)
                elif data is None:
                    client.create(path, new, makepath=True)
                else:
                    client.set(path, new, version=version)
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue
            return result


def _added(pattern: _Pattern, added: list[AclBinding], data: bytes | None) -> tuple[bytes, None]:
    current = decode_acls(*pattern, data) if data is not None else []
    return encode_acls(list(with_acls(current, added))), None


def _removed(
    pattern: _Pattern, filters: Sequence[AclFilter], data: bytes | None
) -> tuple[bytes | None, list[list[AclBinding]]]:
    current = decode_acls(*pattern, data) if data is not None else []
    kept, matched = without_acls(current, filters)
    return (encode_acls(list(kept)) if kept else None), matched


def _altered(
    user: str, upserts: CredentialUpserts, deletions: Sequence[tuple[str, str]], data: bytes | None
) -> tuple[bytes | None, None]:
    config = decode_user_config(data) if data is not None else {}
    credentials = with_credentials(user, scram_credentials(config), upserts, deletions)
    new_config = with_scram_credentials(config, credentials)
    return (encode_user_config(new_config) if new_config else None), None
