"""The operators' subcommands of `onceflow`: their arguments, and how a run ends."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from onceflow.admin import acls, cluster, consume, groups, produce, topics, transactions, users
from onceflow.admin.client import parse_address
from onceflow.admin.confluent import kafka_error_text
from onceflow.admin.errors import AdminError
from onceflow.admin.render import show
from onceflow.properties import PropertiesError, read_properties

COMMANDS = ("topics", "groups", "txn", "cluster", "produce", "consume", "users", "acls")


def _bootstrap(value: str) -> str:
    try:
        for address in value.split(","):
            parse_address(address)
    except AdminError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return value


def _command_config(value: str) -> dict[str, str]:
    try:
        return read_properties(Path(value))
    except PropertiesError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def client_options() -> argparse.ArgumentParser:
    """--bootstrap and --command-config, as Kafka's tools take them."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--bootstrap", type=_bootstrap, default="127.0.0.1:9092", metavar="HOST:PORT", help="a broker to ask"
    )
    options.add_argument(
        "--command-config",
        type=_command_config,
        metavar="FILE",
        help="client properties (librdkafka's names: security.protocol, client.id, ...)",
    )
    return options


def add_admin_commands(commands: argparse._SubParsersAction[Any]) -> None:
    common = argparse.ArgumentParser(add_help=False, parents=[client_options()])
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    common.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS", help="how long to wait for each answer"
    )
    produce.register(commands, client_options())
    consume.register(commands, client_options())
    topics.register(commands, common)
    groups.register(commands, common)
    transactions.register(commands, common)
    cluster.register(commands, common)
    users.register(commands, common)
    acls.register(commands, common)


def run_admin_command(args: argparse.Namespace) -> int:
    """Run the command: a report it returns is shown; produce and consume print as they go and
    return their exit code."""
    name = " ".join(part for part in ("onceflow", args.command, args.action) if part)
    try:
        report = args.run(args)
    except AdminError as error:
        print(f"{name}: {error}", file=sys.stderr)
        return error.exit_code
    except KafkaException as error:  # raised by a confluent-kafka call itself rather than its future
        print(f"{name}: {kafka_error_text(error)}", file=sys.stderr)
        return 1
    if isinstance(report, int):
        return report
    try:
        show(report, args.json)
    except BrokenPipeError:
        # The reader (e.g. `head`) left; point stdout at nothing so the exit flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
