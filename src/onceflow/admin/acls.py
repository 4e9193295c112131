"""`onceflow acls add | list | remove`, after Kafka's `kafka-acls.sh --add | --list | --remove`,
through CreateAcls, DescribeAcls and DeleteAcls (confluent-kafka's AdminClient). The same
options: resources (--topic, --group, --cluster, --transactional-id) with a
--resource-pattern-type, principals (--allow-principal, --deny-principal) from hosts
(--allow-host, --deny-host; every host by default), --operation, and the shortcuts --producer
(WRITE, DESCRIBE and CREATE on the topics; WRITE and DESCRIBE on the transactional ids;
IDEMPOTENT_WRITE on the cluster with --idempotent) and --consumer (READ and DESCRIBE on the
topics, READ on the groups)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from onceflow.admin import confluent
from onceflow.admin.errors import UsageError
from onceflow.admin.render import Column, Report, Table

CLUSTER = "kafka-cluster"
# Kafka's names for operations on the command line: Read, Write, ..., ClusterAction, All.
OPERATIONS = {
    "".join(word.capitalize() for word in operation.name.split("_")): operation
    for operation in AclOperation
    if operation not in (AclOperation.UNKNOWN, AclOperation.ANY)
}
PATTERN_TYPES = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}
FILTER_PATTERN_TYPES = {**PATTERN_TYPES, "any": ResourcePatternType.ANY, "match": ResourcePatternType.MATCH}
_TYPE_NAMES = {
    ResourceType.TOPIC: "Topic",
    ResourceType.GROUP: "Group",
    ResourceType.BROKER: "Cluster",
    ResourceType.TRANSACTIONAL_ID: "TransactionalId",
}
_Resource = tuple[ResourceType, str]

_COLUMNS = (
    Column("resource_type", "resource type"),
    Column("name", "name"),
    Column("pattern_type", "pattern"),
    Column("principal", "principal"),
    Column("host", "host"),
    Column("operation", "operation"),
    Column("permission", "permission"),
)


def _operation(value: str) -> AclOperation:
    for name, operation in OPERATIONS.items():
        if name.lower() == value.replace("_", "").replace("-", "").lower():
            return operation
    raise argparse.ArgumentTypeError(f"unknown operation {value!r} (one of {', '.join(OPERATIONS)})")


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    acls = commands.add_parser("acls", help="add, list and remove ACLs, as kafka-acls.sh")
    actions = acls.add_subparsers(dest="action", required=True, metavar="ACTION")
    resources = argparse.ArgumentParser(add_help=False)
    resources.add_argument("--topic", action="append", default=[], help="repeatable")
    resources.add_argument("--group", action="append", default=[], help="repeatable")
    resources.add_argument("--transactional-id", action="append", default=[], help="repeatable")
    resources.add_argument("--cluster", action="store_true", help="the cluster")
    principals = argparse.ArgumentParser(add_help=False)
    principals.add_argument("--allow-principal", action="append", default=[], metavar="User:NAME")
    principals.add_argument("--deny-principal", action="append", default=[], metavar="User:NAME")
    principals.add_argument("--allow-host", action="append", default=[], metavar="HOST", help="default: *")
    principals.add_argument("--deny-host", action="append", default=[], metavar="HOST", help="default: *")
    principals.add_argument(
        "--operation",
        type=_operation,
        action="append",
        default=[],
        help=f"repeatable: {', '.join(OPERATIONS)}",
    )
    principals.add_argument("--producer", action="store_true", help="what a producer needs")
    principals.add_argument("--idempotent", action="store_true", help="with --producer: IDEMPOTENT_WRITE")
    principals.add_argument("--consumer", action="store_true", help="what a consumer needs")

    add = actions.add_parser("add", parents=[common, resources, principals], help="add ACLs")
    add.add_argument("--resource-pattern-type", choices=sorted(PATTERN_TYPES), default="literal")
    add.set_defaults(run=add_acls)

    remove = actions.add_parser(
        "remove",
        parents=[common, resources, principals],
        help="remove the ACLs these options name (every ACL of the resources without principals)",
    )
    remove.add_argument("--resource-pattern-type", choices=sorted(FILTER_PATTERN_TYPES), default="literal")
    remove.set_defaults(run=remove_acls)

    listing = actions.add_parser("list", parents=[common, resources], help="the ACLs (of these resources)")
    listing.add_argument("--principal", action="append", default=[], metavar="User:NAME")
    listing.add_argument("--resource-pattern-type", choices=sorted(FILTER_PATTERN_TYPES), default="any")
    listing.set_defaults(run=list_acls)


def _resources(args: argparse.Namespace) -> list[_Resource]:
    return [
        *((ResourceType.TOPIC, name) for name in args.topic),
        *((ResourceType.GROUP, name) for name in args.group),
        *((ResourceType.TRANSACTIONAL_ID, name) for name in args.transactional_id),
        *([(ResourceType.BROKER, CLUSTER)] if args.cluster else []),
    ]


def _operations(args: argparse.Namespace, resources: list[_Resource]) -> dict[_Resource, list[AclOperation]]:
    """The operations to grant or deny on each resource: --operation, or the shortcuts'."""
    if not (args.producer or args.consumer):
        if args.idempotent:
            raise UsageError("--idempotent goes with --producer")
        return {resource: list(dict.fromkeys(args.operation)) for resource in resources}
    if args.operation:
        raise UsageError("give --operation or --producer/--consumer, not both")
    by_resource: dict[_Resource, list[AclOperation]] = {}
    topics = [resource for resource in resources if resource[0] == ResourceType.TOPIC]
    if args.producer:
        for topic in topics:
            by_resource.setdefault(topic, []).extend(
                [AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE]
            )
        for resource in resources:
            if resource[0] == ResourceType.TRANSACTIONAL_ID:
                by_resource.setdefault(resource, []).extend([AclOperation.WRITE, AclOperation.DESCRIBE])
        if args.idempotent:
            by_resource.setdefault((ResourceType.BROKER, CLUSTER), []).append(AclOperation.IDEMPOTENT_WRITE)
    if args.consumer:
        for topic in topics:
            by_resource.setdefault(topic, []).extend([AclOperation.READ, AclOperation.DESCRIBE])
        for resource in resources:
            if resource[0] == ResourceType.GROUP:
                by_resource.setdefault(resource, []).append(AclOperation.READ)
        if not any(resource[0] == ResourceType.GROUP for resource in resources):
            raise UsageError("--consumer needs --group")
    if not topics:
        raise UsageError("--producer and --consumer need --topic")
    return {resource: list(dict.fromkeys(operations)) for resource, operations in by_resource.items()}


def _grants(args: argparse.Namespace) -> list[tuple[str, str, AclPermissionType]]:
    """(principal, host, permission) of each principal and host given."""
    for principal in (*args.allow_principal, *args.deny_principal):
        kind, colon, name = principal.partition(":")
        if not colon or not kind or not name:
            raise UsageError(f"principal {principal!r}: expected TYPE:NAME, e.g. User:alice")
    return [
        *(
            (principal, host, AclPermissionType.ALLOW)
            for principal in args.allow_principal
            for host in args.allow_host or ["*"]
        ),
        *(
            (principal, host, AclPermissionType.DENY)
            for principal in args.deny_principal
            for host in args.deny_host or ["*"]
        ),
    ]


def add_acls(args: argparse.Namespace) -> Report:
    resources = _resources(args)
    if not resources:
        raise UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    grants = _grants(args)
    if not grants:
        raise UsageError("name a principal: --allow-principal or --deny-principal")
    operations = _operations(args, resources)
    if not any(operations.values()):
        raise UsageError("name an operation: --operation, --producer or --consumer")
    pattern_type = PATTERN_TYPES[args.resource_pattern_type]
    bindings = [
        AclBinding(
            resource_type,
            name,
            ResourcePatternType.LITERAL if resource_type == ResourceType.BROKER else pattern_type,
            principal,
            host,
            operation,
            permission,
        )
        for (resource_type, name), resource_operations in operations.items()
        for operation in resource_operations
        for principal, host, permission in grants
    ]
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    futures = admin.create_acls(bindings, request_timeout=args.timeout)
    for binding, future in futures.items():
        confluent.wait(future, f"add the ACL {_describe(binding)}", args.timeout)
    rows = [_row(binding) for binding in bindings]
    return Report(rows, [Table(_COLUMNS, rows, title="added")])


def remove_acls(args: argparse.Namespace) -> Report:
    resources = _resources(args)
    if not resources:
        raise UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    pattern_type = FILTER_PATTERN_TYPES[args.resource_pattern_type]
    grants: list[tuple[str | None, str | None, AclPermissionType]] = list(_grants(args))
    if not grants:
        grants = [(None, None, AclPermissionType.ANY)]
    operations = _operations(args, resources) if (args.operation or args.producer or args.consumer) else {}
    filters = list(
        dict.fromkeys(
            _filter(
                resource_type,
                name,
                ResourcePatternType.LITERAL if resource_type == ResourceType.BROKER else pattern_type,
                principal,
                host,
                operation,
                permission,
            )
            for resource_type, name in resources
            for operation in operations.get((resource_type, name), [AclOperation.ANY])
            for principal, host, permission in grants
        )
    )
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    futures = admin.delete_acls(filters, request_timeout=args.timeout)
    removed: list[AclBinding] = []
    for found, future in futures.items():
        removed += confluent.wait(future, f"remove the ACLs {_describe(found)}", args.timeout)
    rows = [_row(binding) for binding in _sorted(removed)]
    return Report(rows, [Table(_COLUMNS, rows, title="removed", empty="no ACL matched")])


def list_acls(args: argparse.Namespace) -> Report:
    pattern_type = FILTER_PATTERN_TYPES[args.resource_pattern_type]
    resources: list[tuple[ResourceType, str | None]] = list(_resources(args)) or [(ResourceType.ANY, None)]
    principals: list[str | None] = list(args.principal) or [None]
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    found: list[AclBinding] = []
    for resource_type, name in resources:
        for principal in principals:
            filter_ = _filter(
                resource_type,
                name,
                ResourcePatternType.LITERAL if resource_type == ResourceType.BROKER else pattern_type,
                principal,
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
            future = admin.describe_acls(filter_, request_timeout=args.timeout)
            found += confluent.wait(future, "list ACLs", args.timeout)
    rows = [_row(binding) for binding in _sorted(dict.fromkeys(found))]
    return Report(rows, [Table(_COLUMNS, rows, empty="no ACLs")])


def _filter(*fields: Any) -> AclBindingFilter:
    """A filter; a None name, principal or host matches every one (the stubs say str)."""
    return AclBindingFilter(*fields)


def _sorted(bindings: Iterable[AclBinding]) -> list[AclBinding]:
    return sorted(bindings, key=lambda binding: tuple(str(value) for value in _row(binding).values()))


def _row(binding: AclBinding | AclBindingFilter) -> dict[str, Any]:
    return {
        "resource_type": _TYPE_NAMES.get(binding.restype, _name(binding.restype)),  # type: ignore[arg-type]
        "name": binding.name,
        "pattern_type": _name(binding.resource_pattern_type),
        "principal": binding.principal,
        "host": binding.host,
        "operation": _name(binding.operation),
        "permission": _name(binding.permission_type),
    }


def _name(value: Any) -> str:
    """An enum's name (confluent-kafka's objects hold enums; the stubs allow str and int)."""
    return str(getattr(value, "name", value))


def _describe(binding: AclBinding | AclBindingFilter) -> str:
    row = _row(binding)
    return (
        f"{row['permission']} {row['principal']} {row['operation']} on {row['resource_type']}:{row['name']}"
        f" ({row['pattern_type']})"
    )
