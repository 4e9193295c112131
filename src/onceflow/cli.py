"""The `onceflow` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

# No command uses Hypothesis, but kio registers strategies for its types whenever Hypothesis is
# importable (in a development install): 0.17 s of the 0.45 s a broker takes to start. Left alone
# when something imported it first.
sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]  # None blocks an import

from onceflow import __version__  # noqa: E402
from onceflow.arguments import CommandParser, output_directory  # noqa: E402
from onceflow.broker.config import BrokerConfig, ConfigError, parse_assignments  # noqa: E402
from onceflow.extras import MissingExtraError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    parser = CommandParser(prog="onceflow", description="Exactly-once streaming in Python.")
    parser.add_argument("--version", action="version", version=f"onceflow {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    broker = commands.add_parser("broker", help="run a Kafka-protocol broker in the foreground")
    broker.add_argument(
        "--listen",
        help="HOST:PORT of one PLAINTEXT listener (port 0 picks a free one; default 127.0.0.1:9092),"
        " unless the config sets listeners",
    )
    # Checked after parsing, so that an unknown flag is named before a missing --data-dir.
    broker.add_argument("--data-dir", type=Path, help="where the logs live (required)")
    broker.add_argument("--config", type=Path, help="a Kafka-style .properties file")
    broker.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key"
    )
    broker.add_argument("--log-level", default="WARNING")
    broker.add_argument(
        "--zookeeper", metavar="HOST:PORT", help="form a cluster through this ZooKeeper (zookeeper.connect)"
    )
    broker.add_argument(
        "--broker-id", type=int, metavar="N", help="this broker's id in the cluster (node.id)"
    )
    broker.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus metrics on /metrics (port 0: a free one)"
    )

    # Brokers start often (the tests, the lab, a supervisor): one parses its arguments without
    # importing the other commands' modules, 0.10 s of the 0.41 s of CPU its start took.
    if arguments[:1] != ["broker"]:
        _add_other_commands(commands)
    args = parser.parse_args(arguments)
    if args.command == "broker" and args.data_dir is None:
        broker.error("the following arguments are required: --data-dir")
    try:
        return _run_broker(args) if args.command == "broker" else _run_other_command(parser, args)
    except ConfigError as error:
        print(f"onceflow: configuration error: {error}", file=sys.stderr)
        return 2
    except MissingExtraError as error:
        print(error, file=sys.stderr)
        return 1


def _add_other_commands(commands: argparse._SubParsersAction[Any]) -> None:
    from onceflow.admin.commands import add_admin_commands

    demo = commands.add_parser(
        "demo", help="the main job: the delivery guarantees side by side under the same faults"
    )
    demo.add_argument(
        "--report-dir", type=output_directory, default=Path("demo-report"), help="JSON and HTML reports"
    )
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--short", action="store_true", help="fewer records, for CI")
    demo.add_argument("--bootstrap", help="an external Kafka cluster (no broker faults then)")

    from onceflow.lab.command import add_lab_arguments

    add_lab_arguments(commands.add_parser("lab", help="the delivery-semantics lab: guarantees under faults"))

    from onceflow.pipeline.command import add_pipeline_arguments

    add_pipeline_arguments(commands.add_parser("pipeline", help="the payments pipeline on Spark"))

    from onceflow.fuzz.command import add_fuzz_arguments

    add_fuzz_arguments(commands.add_parser("fuzz", help="fuzz a broker with mutated real client requests"))

    log = commands.add_parser("log", help="check a data directory's logs (its broker stopped or not)")
    log_commands = log.add_subparsers(dest="log_command", required=True)
    check = log_commands.add_parser("check", help="read every batch, check its CRC, list what does not read")
    check.add_argument("data_dir", type=Path, metavar="DIR")
    check.add_argument("--json", action="store_true", help="the findings as JSON, one object per line")

    add_admin_commands(commands)


def _run_other_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from onceflow.admin.commands import COMMANDS as ADMIN_COMMANDS
    from onceflow.admin.commands import run_admin_command

    if hasattr(args, "foreground"):  # `cluster run`: a long-running command, not a report
        exit_code: int = args.foreground(args)
        return exit_code
    if args.command in ADMIN_COMMANDS:
        return run_admin_command(args)
    if args.command in ("demo", "lab", "fuzz"):
        from onceflow.process_tree import stop_tree_on_interrupt

        stop_tree_on_interrupt()  # they start brokers, clients and pipelines
    if args.command == "log":
        return _check_logs(args.data_dir, args.json)
    if args.command == "demo":
        from onceflow.demo import run_demo

        return run_demo(args.report_dir, args.seed, args.short, args.bootstrap)
    if args.command == "lab":
        from onceflow.lab.command import run_lab_command

        return run_lab_command(args)
    if args.command == "fuzz":
        from onceflow.fuzz.command import run_fuzz_command

        return run_fuzz_command(args)
    if args.command == "pipeline":
        from onceflow.pipeline.command import run_pipeline_command

        return run_pipeline_command(args)
    parser.error(f"unknown command {args.command}")
    return 2


def _run_broker(args: argparse.Namespace) -> int:
    from onceflow.broker.core import Broker
    from onceflow.cluster.errors import ClusterError
    from onceflow.heap_reuse import keep_freed_buffers
    from onceflow.log.errors import LogError, LogLoadError
    from onceflow.server import BrokerServer

    keep_freed_buffers()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    listen = _address("--listen", args.listen) if args.listen is not None else None
    metrics_address = _address("--metrics", args.metrics) if args.metrics is not None else None
    overrides = parse_assignments(args.set)
    if args.zookeeper is not None:
        overrides["zookeeper.connect"] = args.zookeeper
    if args.broker_id is not None:
        overrides["node.id"] = str(args.broker_id)
    config = BrokerConfig.load(args.config, overrides)
    for warning in config.without_effect():
        logging.getLogger("onceflow.broker").warning("%s", warning)
    _raise_open_file_limit()

    async def serve() -> None:
        # Handlers first: a SIGTERM right after the "listening" line must still stop cleanly.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            broker = Broker(args.data_dir, config, metrics=metrics_address is not None)
            server = BrokerServer(broker, listen, metrics_address)
            await server.start()
        except (LogError, OSError, ClusterError) as error:
            raise ConfigError(f"cannot start the broker: {error}") from error
        except LogLoadError as error:
            raise _CannotStart(str(error)) from error
        # One line per listener, the first first; a lone --listen listener's without its name.
        for listener in server.listeners:
            bound_host, bound_port = server.addresses[listener.name]
            name = f"{listener.name}://" if config.get("listeners") else ""
            print(f"onceflow broker listening on {name}{bound_host}:{bound_port}", flush=True)
        if server.metrics_address is not None:
            metrics_host, metrics_port = server.metrics_address
            print(f"onceflow broker metrics on http://{metrics_host}:{metrics_port}/metrics", flush=True)
        stopped, halted = asyncio.create_task(stop.wait()), asyncio.create_task(broker.halted.wait())
        await asyncio.wait([stopped, halted], return_when=asyncio.FIRST_COMPLETED)
        if broker.halted.is_set():
            # Kafka's Exit.halt: no shutdown, whose flush could succeed after the failed one.
            print(f"onceflow broker: halted: {broker.storage_failure}", file=sys.stderr, flush=True)
            os._exit(1)
        halted.cancel()
        await server.stop()

    try:
        asyncio.run(serve())
    except _CannotStart as error:
        print(f"onceflow broker: cannot start: {error}", file=sys.stderr)
        return 1
    return 0


class _CannotStart(Exception):
    """What is on disk stops the start (an unreadable file about the logs): one line, exit 1."""


def _check_logs(data_dir: Path, as_json: bool) -> int:
    """`onceflow log check DIR`: exit 0 when every batch reads, 1 when a corrupt stretch was found."""
    from onceflow.log.check import SegmentsChecked, check_data_dir

    if not data_dir.is_dir():
        raise ConfigError(f"{data_dir} is not a directory")
    checked = SegmentsChecked()
    found = 0
    for finding in check_data_dir(data_dir, checked):
        found += 1
        corrupt = finding.corrupt
        end_offset = "the end" if corrupt.end_offset is None else str(corrupt.end_offset)
        if as_json:
            print(
                json.dumps(
                    {
                        "topic": finding.topic,
                        "partition": finding.partition,
                        "segment": finding.segment,
                        "position": corrupt.position,
                        "end_position": corrupt.end_position,
                        "first_offset": corrupt.first_offset,
                        "end_offset": corrupt.end_offset,
                    }
                )
            )
        else:
            print(
                f"{finding.topic}-{finding.partition} {finding.segment}: bytes {corrupt.position}-"
                f"{corrupt.end_position} hold no readable batch "
                f"(offsets {corrupt.first_offset} to {end_offset})"
            )
    summary = (
        f"{checked.partitions} partitions, {checked.segments} segments, {checked.batches} batches "
        f"({checked.bytes} bytes) read: {found} corrupt"
    )
    print(summary, file=sys.stderr if as_json else sys.stdout)
    return 1 if found else 0


def _raise_open_file_limit() -> None:
    """Every partition keeps files open: take the most descriptors the hard limit allows, as
    Kafka's operators are told to."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _address(option: str, text: str) -> tuple[str, int]:
    """HOST:PORT; an empty host means 127.0.0.1."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"{option} wants HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port_text)


if __name__ == "__main__":
    sys.exit(main())
