"""The authorizer, after Kafka's StandardAuthorizer: super users may do anything; otherwise an
ACL that denies the operation (or ALL) to the principal (or `User:*`) from the host (or `*`)
wins over any that allows it; an allowing ACL may allow the operation itself, ALL, or an
operation that implies it (READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS
implies DESCRIBE_CONFIGS). A resource that no ACL covers at all is allowed only with
`allow.everyone.if.no.acl.found`.

The ACLs live in a store (the data directory, or ZooKeeper in a cluster); the authorizer holds
what the store last gave it and answers from memory. Decisions are cached until the ACLs change.
"""

from __future__ import annotations

from collections.abc import Iterable

from onceflow.security.acls import (
    IMPLIED_BY,
    SUPPORTED_OPERATIONS,
    WILDCARD,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

WILDCARD_PRINCIPAL = "User:*"
_CACHE_LIMIT = 100_000
_Decision = tuple[str, str, Operation, ResourceType, str]


def parse_super_users(value: str) -> frozenset[str]:
    """`super.users`: principals separated by semicolons (`User:admin;User:broker`)."""
    return frozenset(item.strip() for item in value.split(";") if item.strip())


class Authorizer:
    def __init__(
        self,
        super_users: frozenset[str],
        allow_if_no_acl: bool,
        bindings: Iterable[AclBinding] | None = (),
    ) -> None:
        """`bindings` None: the store has not been read yet (a cluster's broker before it
        reads ZooKeeper), and until `replace` gives them only super users are allowed."""
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        self._by_type: dict[ResourceType, tuple[AclBinding, ...]] = {}
        self._bindings: tuple[AclBinding, ...] = ()
        self._decisions: dict[_Decision, bool] = {}
        self._loaded = bindings is not None
        self.replace(bindings or ())
        self._loaded = bindings is not None

    @property
    def bindings(self) -> tuple[AclBinding, ...]:
        return self._bindings

    def replace(self, bindings: Iterable[AclBinding]) -> None:
        """The store's ACLs now: every later decision reads these."""
        self._bindings = tuple(dict.fromkeys(bindings))
        by_type: dict[ResourceType, list[AclBinding]] = {}
        for binding in self._bindings:
            by_type.setdefault(binding.resource_type, []).append(binding)
        self._by_type = {key: tuple(value) for key, value in by_type.items()}
        self._decisions = {}
        self._loaded = True

    def authorize(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            if len(self._decisions) >= _CACHE_LIMIT:
                self._decisions = {}
            decision = self._decisions[key] = self._decide(principal, host, operation, resource_type, name)
        return decision

    def _decide(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str
    ) -> bool:
        if principal in self.super_users:
            return True
        if not self._loaded:
            return False
        implied_by = IMPLIED_BY.get(operation, frozenset())
        covered = allowed = False
        for binding in self._by_type.get(resource_type, ()):
            if not binding.covers(resource_type, name):
                continue
            covered = True
            if binding.principal not in (principal, WILDCARD_PRINCIPAL) or binding.host not in (
                host,
                WILDCARD,
            ):
                continue
            if binding.permission is Permission.DENY:
                if binding.operation in (operation, Operation.ALL):
                    return False
            elif binding.operation in (operation, Operation.ALL) or binding.operation in implied_by:
                allowed = True
        return allowed or (not covered and self.allow_if_no_acl)

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str) -> int:
        """The bit field Kafka's authorized_operations fields carry: each operation of the
        resource type this principal may do on the resource."""
        return sum(
            1 << operation
            for operation in SUPPORTED_OPERATIONS.get(resource_type, ())
            if self.authorize(principal, host, operation, resource_type, name)
        )

    def allowed_somewhere(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Kafka's authorizeByResourceType: whether some resource of the type allows the
        operation to the principal, through an ACL no DENY overrides (InitProducerId of an
        idempotent producer asks it for WRITE on any topic)."""
        if principal in self.super_users:
            return True
        if not self._loaded:
            return False
        bindings = self._by_type.get(resource_type, ())
        if not bindings:
            return self.allow_if_no_acl
        mine = [
            binding
            for binding in bindings
            if binding.principal in (principal, WILDCARD_PRINCIPAL)
            and binding.host in (host, WILDCARD)
            and binding.operation in (operation, Operation.ALL)
        ]
        denies = [binding for binding in mine if binding.permission is Permission.DENY]
        if any(deny.pattern_type is PatternType.LITERAL and deny.name == WILDCARD for deny in denies):
            return False
        denied_prefixes = [deny.name for deny in denies if deny.pattern_type is PatternType.PREFIXED]
        denied_names = {deny.name for deny in denies if deny.pattern_type is PatternType.LITERAL}
        for allow in mine:
            if allow.permission is not Permission.ALLOW:
                continue
            if allow.pattern_type is PatternType.LITERAL and allow.name in denied_names:
                continue
            if not any(allow.name.startswith(prefix) for prefix in denied_prefixes):
                return True
        return False
