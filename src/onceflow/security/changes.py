"""What CreateAcls, DeleteAcls and AlterUserScramCredentials make of the ACLs and credentials
they change: pure functions, which both stores apply (the data directory's to everything it
holds, ZooKeeper's to one znode's share at a time)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from onceflow.security.acls import AclBinding, AclFilter
from onceflow.security.scram import ScramCredential

# A user's credentials, by mechanism name.
Credentials = dict[str, dict[str, ScramCredential]]
CredentialUpserts = Mapping[tuple[str, str], ScramCredential]  # by (user, mechanism)


def with_acls(current: Iterable[AclBinding], added: Iterable[AclBinding]) -> tuple[AclBinding, ...]:
    """The ACLs and the new ones, each once, in the order they came."""
    return tuple(dict.fromkeys((*current, *added)))


def without_acls(
    current: Sequence[AclBinding], filters: Sequence[AclFilter]
) -> tuple[tuple[AclBinding, ...], list[list[AclBinding]]]:
    """The ACLs no filter matches, and the ones each filter matched."""
    matched = [[binding for binding in current if found.matches(binding)] for found in filters]
    gone = {binding for bindings in matched for binding in bindings}
    return tuple(binding for binding in current if binding not in gone), matched


def with_credentials(
    user: str,
    current: Mapping[str, ScramCredential],
    upserts: CredentialUpserts,
    deletions: Iterable[tuple[str, str]],
) -> dict[str, ScramCredential]:
    """One user's credentials after the changes that name them."""
    credentials = dict(current)
    for (name, mechanism), credential in upserts.items():
        if name == user:
            credentials[mechanism] = credential
    for name, mechanism in deletions:
        if name == user:
            credentials.pop(mechanism, None)
    return credentials
