"""The znodes of a cluster's ACLs and SCRAM credentials, in Kafka's ZooKeeper-era layout:

- `/kafka-acl/<ResourceType>/<name>` (LITERAL patterns) and
  `/kafka-acl-extended/prefixed/<ResourceType>/<name>` (PREFIXED), each
  `{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read","host":"*"}]}`;
- `/config/users/<name>`,
  `{"version":1,"config":{"SCRAM-SHA-256":"salt=..,stored_key=..,server_key=..,iterations=4096"}}`
  (other keys of a user's config, such as quotas, are kept as they are).

A name that ZooKeeper cannot take as one path segment (with a `/`, or `.` and `..`) is
percent-encoded; `%` is too, so that every name comes back as it was.

Decoding raises ValueError on anything malformed, so a bad znode is reported, never trusted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from onceflow.security.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from onceflow.security.scram import HASHES, ScramCredential

LITERAL_ACLS = "/kafka-acl"
PREFIXED_ACLS = "/kafka-acl-extended/prefixed"
USERS = "/config/users"
ACL_ROOTS = {PatternType.LITERAL: LITERAL_ACLS, PatternType.PREFIXED: PREFIXED_ACLS}

# Kafka's names in paths and JSON (SecurityUtils.resourceTypeName and operationName).
RESOURCE_TYPE_NAMES = {
    ResourceType.TOPIC: "Topic",
    ResourceType.GROUP: "Group",
    ResourceType.CLUSTER: "Cluster",
    ResourceType.TRANSACTIONAL_ID: "TransactionalId",
    ResourceType.DELEGATION_TOKEN: "DelegationToken",
    ResourceType.USER: "User",
}
RESOURCE_TYPES = {name: resource_type for resource_type, name in RESOURCE_TYPE_NAMES.items()}
_PERMISSIONS = {Permission.ALLOW: "Allow", Permission.DENY: "Deny"}


def _camel(operation: Operation) -> str:
    return "".join(word.capitalize() for word in operation.name.split("_"))


_OPERATIONS = {_camel(operation): operation for operation in Operation if operation > Operation.ANY}


def acl_type_path(pattern_type: PatternType, resource_type: ResourceType) -> str:
    return f"{ACL_ROOTS[pattern_type]}/{RESOURCE_TYPE_NAMES[resource_type]}"


def acl_path(pattern_type: PatternType, resource_type: ResourceType, name: str) -> str:
    return f"{acl_type_path(pattern_type, resource_type)}/{segment(name)}"


def user_path(name: str) -> str:
    return f"{USERS}/{segment(name)}"


def segment(name: str) -> str:
    """`name` as one znode name."""
    escaped = name.replace("%", "%25").replace("/", "%2F")
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def unsegment(text: str) -> str:
    return re.sub("%(25|2F|2E)", lambda match: {"25": "%", "2F": "/", "2E": "."}[match[1]], text)


def encode_acls(bindings: list[AclBinding]) -> bytes:
    """One resource pattern's ACLs (all of the same type, name and pattern type)."""
    return _dump(
        {
            "version": 1,
            "acls": [
                {
                    "principal": binding.principal,
                    "permissionType": _PERMISSIONS[binding.permission],
                    "operation": _camel(binding.operation),
                    "host": binding.host,
                }
                for binding in bindings
            ],
        }
    )


def decode_acls(
    pattern_type: PatternType, resource_type: ResourceType, name: str, data: bytes
) -> list[AclBinding]:
    acls = _load(data).get("acls")
    if not isinstance(acls, list):
        raise ValueError("acls: expected a list")
    bindings = []
    for entry in acls:
        if not isinstance(entry, dict):
            raise ValueError(f"not an ACL: {entry!r}")
        permission = {text: value for value, text in _PERMISSIONS.items()}.get(
            str(entry.get("permissionType"))
        )
        operation = _OPERATIONS.get(str(entry.get("operation")))
        if permission is None or operation is None:
            raise ValueError(f"not an ACL: {entry!r}")
        bindings.append(
            AclBinding(
                resource_type,
                name,
                pattern_type,
                _str(entry, "principal"),
                _str(entry, "host"),
                operation,
                permission,
            )
        )
    return bindings


def decode_user_config(data: bytes) -> dict[str, str]:
    """A user's config: SCRAM credentials by mechanism, and whatever else Kafka keeps there."""
    config = _load(data).get("config")
    if not isinstance(config, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in config.items()
    ):
        raise ValueError("config: expected an object of strings")
    return config


def encode_user_config(config: Mapping[str, str]) -> bytes:
    return _dump({"version": 1, "config": dict(config)})


def scram_credentials(config: Mapping[str, str]) -> dict[str, ScramCredential]:
    return {
        mechanism: ScramCredential.decode(text) for mechanism, text in config.items() if mechanism in HASHES
    }


def with_scram_credentials(
    config: Mapping[str, str], credentials: Mapping[str, ScramCredential]
) -> dict[str, str]:
    """The config with its SCRAM credentials replaced by `credentials`."""
    kept = {key: value for key, value in config.items() if key not in HASHES}
    return {**kept, **{mechanism: credential.encode() for mechanism, credential in credentials.items()}}


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _load(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not JSON: {error}") from error
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return value


def _str(fields: Mapping[str, Any], key: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value
