"""The operators' subcommands of `onceflow`: their arguments, and how a run ends."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from confluent_kafka import KafkaException

from onceflow.admin import cluster, groups, topics, transactions
from onceflow.admin.client import parse_address
from onceflow.admin.confluent import kafka_error_text
from onceflow.admin.errors import AdminError
from onceflow.admin.render import show

COMMANDS = ("topics", "groups", "txn", "cluster")


def _bootstrap(value: str) -> str:
    try:
        for address in value.split(","):
            parse_address(address)
    except AdminError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return value


def add_admin_commands(commands: argparse._SubParsersAction[Any]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bootstrap", type=_bootstrap, default="127.0.0.1:9092", metavar="HOST:PORT", help="a broker to ask"
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")
    common.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS", help="how long to wait for each answer"
    )
    topics.register(commands, common)
    groups.register(commands, common)
    transactions.register(commands, common)
    cluster.register(commands, common)


def run_admin_command(args: argparse.Namespace) -> int:
    try:
        report = args.run(args)
    except AdminError as error:
        print(f"onceflow {args.command} {args.action}: {error}", file=sys.stderr)
        return error.exit_code
    except KafkaException as error:  # raised by a confluent-kafka call itself rather than its future
        print(f"onceflow {args.command} {args.action}: {kafka_error_text(error)}", file=sys.stderr)
        return 1
    try:
        show(report, args.json)
    except BrokenPipeError:
        # The reader (e.g. `head`) left; point stdout at nothing so the exit flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
