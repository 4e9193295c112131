"""`onceflow users add | remove | list`: SCRAM users, through AlterUserScramCredentials and
DescribeUserScramCredentials (confluent-kafka's AdminClient), as `kafka-configs.sh
--entity-type users --add-config 'SCRAM-SHA-256=[password=...]'` manages them. The client salts
the password (KIP-554): it never crosses the wire. Only a super user (or one with ALTER on the
cluster) may change users."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)

from onceflow.admin import confluent
from onceflow.admin.errors import AdminError
from onceflow.admin.render import Column, Report, Table

MECHANISMS = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
DEFAULT_ITERATIONS = 4096  # Kafka's default; it accepts 4096 to 16384


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    users = commands.add_parser("users", help="add, remove and list SCRAM users")
    actions = users.add_subparsers(dest="action", required=True, metavar="ACTION")

    add = actions.add_parser("add", parents=[common], help="add a user, or set a user's password")
    add.add_argument("user")
    add.add_argument(
        "--password", help="the password (default: asked for, or read as one line from standard input)"
    )
    add.add_argument(
        "--mechanism",
        choices=sorted(MECHANISMS),
        action="append",
        help="repeatable (default: SCRAM-SHA-256 and SCRAM-SHA-512)",
    )
    add.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, help="4096 to 16384")
    add.set_defaults(run=add_user)

    remove = actions.add_parser("remove", parents=[common], help="remove a user's credentials")
    remove.add_argument("user")
    remove.add_argument(
        "--mechanism", choices=sorted(MECHANISMS), action="append", help="repeatable (default: every one)"
    )
    remove.set_defaults(run=remove_user)

    listing = actions.add_parser("list", parents=[common], help="the users and their mechanisms")
    listing.add_argument("user", nargs="*", help="these users only")
    listing.set_defaults(run=list_users)


def _password(given: str | None) -> str:
    if given is not None:
        password = given
    elif sys.stdin.isatty():
        password = getpass.getpass("password: ")
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise AdminError("the password is empty")
    return password


def add_user(args: argparse.Namespace) -> Report:
    password = _password(args.password)
    mechanisms = args.mechanism or sorted(MECHANISMS)
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            args.user, ScramCredentialInfo(MECHANISMS[name], args.iterations), password.encode()
        )
        for name in dict.fromkeys(mechanisms)
    ]
    futures = admin.alter_user_scram_credentials(upserts, request_timeout=args.timeout)
    confluent.wait(futures[args.user], f"add user {args.user!r}", args.timeout)
    return Report(
        {"user": args.user, "mechanisms": list(dict.fromkeys(mechanisms)), "iterations": args.iterations},
        notes=[f"user {args.user!r} can log in with {', '.join(dict.fromkeys(mechanisms))}"],
    )


def remove_user(args: argparse.Namespace) -> Report:
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    mechanisms = args.mechanism or [
        mechanism for mechanism, _ in _described(admin, [args.user], args.timeout).get(args.user, [])
    ]
    if not mechanisms:
        raise AdminError(f"unknown user {args.user!r}")
    deletions: list[UserScramCredentialAlteration] = [
        UserScramCredentialDeletion(args.user, MECHANISMS[name]) for name in dict.fromkeys(mechanisms)
    ]
    futures = admin.alter_user_scram_credentials(deletions, request_timeout=args.timeout)
    confluent.wait(futures[args.user], f"remove user {args.user!r}", args.timeout)
    return Report(
        {"user": args.user, "mechanisms": list(dict.fromkeys(mechanisms))},
        notes=[f"removed {', '.join(dict.fromkeys(mechanisms))} of user {args.user!r}"],
    )


def list_users(args: argparse.Namespace) -> Report:
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    described = _described(admin, args.user or None, args.timeout)
    rows = [
        {"user": user, "mechanism": mechanism, "iterations": iterations}
        for user, credentials in sorted(described.items())
        for mechanism, iterations in credentials
    ]
    columns = (
        Column("user", "user"),
        Column("mechanism", "mechanism"),
        Column("iterations", "iterations", justify="right"),
    )
    return Report(rows, [Table(columns, rows, empty="no SCRAM users")])


def _described(admin: Any, users: list[str] | None, timeout_s: float) -> dict[str, list[tuple[str, int]]]:
    """Each user's (mechanism, iterations); None: every user."""
    if users is None:
        found: dict[str, UserScramCredentialsDescription] = confluent.wait(
            admin.describe_user_scram_credentials(request_timeout=timeout_s), "list users", timeout_s
        )
    else:
        futures = admin.describe_user_scram_credentials(users, request_timeout=timeout_s)
        found = {}
        for user, future in futures.items():
            try:
                found[user] = future.result(timeout=timeout_s)
            except KafkaException as error:
                if error.args and error.args[0].code() == KafkaError.RESOURCE_NOT_FOUND:
                    continue  # a user without credentials
                raise AdminError(
                    f"cannot describe user {user!r}: {confluent.kafka_error_text(error)}"
                ) from error
            except TimeoutError as error:
                raise AdminError(
                    f"cannot describe user {user!r}: no answer within {timeout_s:g} s"
                ) from error
    return {
        user: [
            (info.mechanism.name.replace("_", "-"), info.iterations)
            for info in description.scram_credential_infos
        ]
        for user, description in found.items()
    }
