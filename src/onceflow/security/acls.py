"""ACLs as Kafka's wire protocol and its `kafka-acls.sh` name them: resource patterns,
operations, permissions, and the filters DescribeAcls and DeleteAcls match with."""

from __future__ import annotations

import enum
from dataclasses import dataclass

WILDCARD = "*"  # a LITERAL resource name, a principal's name or a host that matches every one
CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# Kafka's AclEntry.supportedOperations: what an ACL may name for each resource type, and what
# authorized_operations fields report.
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({
        Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE,
        Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
    }),
    ResourceType.GROUP: frozenset({Operation.READ, Operation.DESCRIBE, Operation.DELETE}),
    ResourceType.CLUSTER: frozenset({
        Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE,
    }),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.DESCRIBE, Operation.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({Operation.DESCRIBE}),
    ResourceType.USER: frozenset({Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS}),
}  # fmt: skip

# An ALLOW of one of these also allows the operation it is keyed under (Kafka's implied
# operations); a DENY implies nothing.
IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}


class AclError(ValueError):
    """An ACL or filter that Kafka refuses (INVALID_REQUEST with this message)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: `principal` from `host` is allowed or denied `operation` on the resources the
    pattern (type, name, LITERAL or PREFIXED) covers."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def covers(self, resource_type: ResourceType, name: str) -> bool:
        """Whether this ACL's pattern matches the resource (a literal `*` matches every one)."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name in (name, WILDCARD)

    def check(self) -> AclBinding:
        """This binding if CreateAcls may store it; else AclError with Kafka's message."""
        if self.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise AclError(f"Invalid resource type {self.resource_type.name}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(f"Invalid pattern type {self.pattern_type.name}")
        if self.operation in (Operation.ANY, Operation.UNKNOWN):
            raise AclError(f"Invalid operation {self.operation.name}")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise AclError(f"Invalid permission type {self.permission.name}")
        if not self.name:
            raise AclError("Resource name should not be empty")
        if self.pattern_type is PatternType.PREFIXED and self.name == WILDCARD:
            raise AclError("Prefixed resource patterns may not be the wildcard")
        if self.resource_type is ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        if self.operation is not Operation.ALL and self.operation not in SUPPORTED_OPERATIONS.get(
            self.resource_type, frozenset()
        ):
            raise AclError(
                f"Operation {self.operation.name} is not supported for resource type "
                f"{self.resource_type.name}"
            )
        kind, sep, _ = self.principal.partition(":")
        if not sep or not kind:
            raise AclError(f"Could not parse principal from `{self.principal}` (no colon is present)")
        return self


@dataclass(frozen=True, slots=True)
class AclFilter:
    """What DescribeAcls and DeleteAcls match: None (or ANY) matches every value; the MATCH
    pattern type matches the bindings that would apply to a resource of that name."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def check(self) -> AclFilter:
        for field, value in (
            ("resource type", self.resource_type),
            ("pattern type", self.pattern_type),
            ("operation", self.operation),
            ("permission type", self.permission),
        ):
            if value == 0:
                raise AclError(f"Invalid {field} UNKNOWN")
        return self

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and binding.resource_type != self.resource_type:
            return False
        if not self._matches_pattern(binding):
            return False
        if self.principal is not None and binding.principal != self.principal:
            return False
        if self.host is not None and binding.host != self.host:
            return False
        if self.operation is not Operation.ANY and binding.operation != self.operation:
            return False
        return self.permission is Permission.ANY or binding.permission == self.permission

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.pattern_type is PatternType.MATCH:
            if self.name is None:
                return True
            if binding.pattern_type is PatternType.PREFIXED:
                return self.name.startswith(binding.name)
            return binding.name in (self.name, WILDCARD)
        if self.pattern_type is not PatternType.ANY and binding.pattern_type != self.pattern_type:
            return False
        return self.name is None or binding.name == self.name
