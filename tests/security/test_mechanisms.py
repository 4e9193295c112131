"""The SASL mechanisms against RFC 7677's SCRAM-SHA-256 example, and the authorizer's rules."""

from __future__ import annotations

import base64

import pytest

from onceflow.security import scram
from onceflow.security.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from onceflow.security.authorizer import Authorizer
from onceflow.security.plain import PlainServer
from onceflow.security.sasl_errors import AuthenticationFailed
from onceflow.security.scram import ScramClient, ScramCredential, ScramServer

CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _server(monkeypatch: pytest.MonkeyPatch, known: bool = True) -> ScramServer:
    monkeypatch.setattr(scram.secrets, "token_urlsafe", lambda _: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = ScramCredential.from_password("SCRAM-SHA-256", "pencil", 4096, salt)
    return ScramServer("SCRAM-SHA-256", lambda user: credential if known and user == "user" else None, b"k")


def test_scram_sha_256_answers_rfc_7677s_example(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(monkeypatch)
    assert server.step(CLIENT_FIRST) == (SERVER_FIRST, None)
    assert server.step(CLIENT_FINAL) == (SERVER_FINAL, "User:user")


def test_a_wrong_proof_and_an_unknown_user_fail_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(monkeypatch)
    server.step(CLIENT_FIRST)
    with pytest.raises(AuthenticationFailed, match="invalid credentials"):
        server.step(CLIENT_FINAL.replace(b"p=dH", b"p=dI"))
    unknown = _server(monkeypatch, known=False)
    first, _ = unknown.step(CLIENT_FIRST)
    assert first.startswith(b"r=rOprNGfwEbeRWgbNEkqO") and b",i=4096" in first  # looks like any other
    with pytest.raises(AuthenticationFailed, match="invalid credentials"):
        unknown.step(CLIENT_FINAL)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_brokers_client_logs_in_to_the_server(mechanism: str) -> None:
    credential = ScramCredential.from_password(mechanism, "secret")
    server = ScramServer(mechanism, lambda user: credential, b"k")
    client = ScramClient(mechanism, "broker", "secret")
    first, _ = server.step(client.first())
    final, principal = server.step(client.final(first))
    client.verify(final)
    assert principal == "User:broker"
    wrong = ScramClient(mechanism, "broker", "guess")  # the control
    server = ScramServer(mechanism, lambda user: credential, b"k")
    first, _ = server.step(wrong.first())
    with pytest.raises(AuthenticationFailed):
        server.step(wrong.final(first))


def test_plain_checks_the_user_and_the_password() -> None:
    server = PlainServer({"alice": "secret"})
    assert server.step(b"\0alice\0secret") == (b"", "User:alice")
    for bad in (b"\0alice\0Secret", b"\0bob\0secret", b"bob\0alice\0secret", b"alice\0secret"):
        with pytest.raises(AuthenticationFailed):
            server.step(bad)


def _acl(name: str, operation: Operation, permission: Permission, pattern: PatternType = PatternType.LITERAL,
         principal: str = "User:alice") -> AclBinding:  # fmt: skip
    return AclBinding(ResourceType.TOPIC, name, pattern, principal, "*", operation, permission)


def test_the_authorizers_rules() -> None:
    topic = ResourceType.TOPIC
    authorizer = Authorizer(frozenset({"User:admin"}), allow_if_no_acl=False)
    assert not authorizer.authorize("User:alice", "h", Operation.READ, topic, "t")  # no ACL: denied
    assert authorizer.authorize("User:admin", "h", Operation.DELETE, topic, "t")  # a super user
    authorizer.replace([_acl("t", Operation.READ, Permission.ALLOW)])
    assert authorizer.authorize("User:alice", "h", Operation.READ, topic, "t")
    assert authorizer.authorize("User:alice", "h", Operation.DESCRIBE, topic, "t")  # implied by READ
    assert not authorizer.authorize("User:alice", "h", Operation.WRITE, topic, "t")
    assert not authorizer.authorize("User:bob", "h", Operation.READ, topic, "t")
    authorizer.replace([*authorizer.bindings, _acl("t", Operation.READ, Permission.DENY, principal="User:*")])
    assert not authorizer.authorize("User:alice", "h", Operation.READ, topic, "t")  # DENY over ALLOW
    assert authorizer.authorize("User:alice", "h", Operation.DESCRIBE, topic, "t")  # a DENY implies nothing
    authorizer.replace([_acl("pay", Operation.WRITE, Permission.ALLOW, PatternType.PREFIXED)])
    assert authorizer.authorize("User:alice", "h", Operation.WRITE, topic, "payments")
    assert not authorizer.authorize("User:alice", "h", Operation.WRITE, topic, "orders")
    assert authorizer.allowed_somewhere("User:alice", "h", Operation.WRITE, topic)
    assert not authorizer.allowed_somewhere("User:bob", "h", Operation.WRITE, topic)
    everyone = Authorizer(frozenset(), allow_if_no_acl=True, bindings=authorizer.bindings)
    assert everyone.authorize("User:bob", "h", Operation.READ, topic, "orders")  # no ACL covers it
    assert not everyone.authorize("User:bob", "h", Operation.WRITE, topic, "payments")  # one does
