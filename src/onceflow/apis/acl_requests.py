"""The ACL APIs' requests as `security.acls` values (CreateAcls' creations, DescribeAcls' and
DeleteAcls' filters), and bindings as their answers name them."""

from __future__ import annotations

from typing import Any

from onceflow.security.acls import (
    AclBinding,
    AclError,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)


def _enum(kind: type[Any], value: int) -> Any:
    try:
        return kind(int(value))
    except ValueError:
        return kind(0)  # UNKNOWN: refused by the checks


def binding(creation: Any) -> AclBinding:
    """A CreateAcls creation; AclError when Kafka would refuse it."""
    return AclBinding(
        _enum(ResourceType, creation.resource_type),
        creation.resource_name,
        _enum(PatternType, creation.resource_pattern_type),
        creation.principal,
        creation.host,
        _enum(Operation, creation.operation),
        _enum(Permission, creation.permission_type),
    ).check()


def acl_filter(fields: Any) -> AclFilter:
    """DescribeAcls' request, or one of DeleteAcls' filters; AclError for an UNKNOWN value."""
    return AclFilter(
        _enum(ResourceType, fields.resource_type_filter),
        fields.resource_name_filter,
        _enum(PatternType, fields.pattern_type_filter),
        fields.principal_filter,
        fields.host_filter,
        _enum(Operation, fields.operation),
        _enum(Permission, fields.permission_type),
    ).check()


def described(found: AclBinding) -> dict[str, Any]:
    return {
        "resource_type": int(found.resource_type),
        "resource_name": found.name,
        "pattern_type": int(found.pattern_type),
        "principal": found.principal,
        "host": found.host,
        "operation": int(found.operation),
        "permission_type": int(found.permission),
    }


__all__ = ["AclError", "acl_filter", "binding", "described"]
