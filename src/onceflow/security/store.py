"""The ACLs and SCRAM credentials of a broker on its own, in its data directory: `acls.json` and
`scram-credentials.json`, each replaced whole (written to a temporary file, fsynced, renamed,
the directory fsynced) before a change is acknowledged. In a cluster they live in ZooKeeper."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from onceflow.security.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from onceflow.security.changes import Credentials
from onceflow.security.scram import ScramCredential

ACLS_FILE = "acls.json"
CREDENTIALS_FILE = "scram-credentials.json"


class SecurityStoreError(ValueError):
    """A file that cannot be read: the broker does not start, rather than run without its ACLs."""


def binding_to_json(binding: AclBinding) -> dict[str, Any]:
    return {
        "resourceType": binding.resource_type.name,
        "name": binding.name,
        "patternType": binding.pattern_type.name,
        "principal": binding.principal,
        "host": binding.host,
        "operation": binding.operation.name,
        "permissionType": binding.permission.name,
    }


def binding_from_json(fields: Mapping[str, Any]) -> AclBinding:
    try:
        return AclBinding(
            ResourceType[fields["resourceType"]],
            str(fields["name"]),
            PatternType[fields["patternType"]],
            str(fields["principal"]),
            str(fields["host"]),
            Operation[fields["operation"]],
            Permission[fields["permissionType"]],
        ).check()
    except (KeyError, TypeError, ValueError) as error:
        raise SecurityStoreError(f"not an ACL: {fields!r} ({error})") from None


class SecurityFiles:
    def __init__(self, data_dir: Path) -> None:
        self._dir = data_dir

    def load_acls(self) -> list[AclBinding]:
        return [binding_from_json(fields) for fields in self._read(ACLS_FILE, "acls")]

    def save_acls(self, bindings: Iterable[AclBinding]) -> None:
        self._write(ACLS_FILE, {"version": 1, "acls": [binding_to_json(binding) for binding in bindings]})

    def load_credentials(self) -> Credentials:
        users: Credentials = {}
        for fields in self._read(CREDENTIALS_FILE, "users"):
            try:
                users[str(fields["name"])] = {
                    str(mechanism): ScramCredential.decode(str(text))
                    for mechanism, text in fields["credentials"].items()
                }
            except (KeyError, TypeError, AttributeError, ValueError) as error:
                raise SecurityStoreError(f"{CREDENTIALS_FILE}: bad user entry ({error})") from None
        return users

    def save_credentials(self, users: Mapping[str, Mapping[str, ScramCredential]]) -> None:
        self._write(
            CREDENTIALS_FILE,
            {
                "version": 1,
                "users": [
                    {
                        "name": name,
                        "credentials": {mech: cred.encode() for mech, cred in sorted(creds.items())},
                    }
                    for name, creds in sorted(users.items())
                    if creds
                ],
            },
        )

    def _read(self, name: str, key: str) -> list[dict[str, Any]]:
        path = self._dir / name
        try:
            content = json.loads(path.read_text())
            items = content[key]
            if not isinstance(items, list):
                raise TypeError(f"{key} is not a list")
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SecurityStoreError(f"cannot read {path}: {error}") from None
        return items

    def _write(self, name: str, content: dict[str, Any]) -> None:
        path = self._dir / name
        temporary = path.with_suffix(".tmp")
        with open(temporary, "w") as file:
            os.fchmod(file.fileno(), 0o600)  # credentials are secrets of a sort: the salted keys
            json.dump(content, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        directory = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
