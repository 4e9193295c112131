"""`onceflow pipeline run` and `onceflow pipeline generate`."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any
from urllib.parse import urlparse

from confluent_kafka import KafkaException

from onceflow.admin.client import check_reachable
from onceflow.admin.errors import AdminError
from onceflow.arguments import output_directory, positive_float, positive_int
from onceflow.pipeline.events import INPUT_TOPIC, generate
from onceflow.pipeline.settings import AT_LEAST_ONCE, EXACTLY_ONCE, PipelineSettings
from onceflow.stores import StoreError, open_store

REACH_TIMEOUT_S = 5.0


def spark_master(text: str) -> str:
    """Spark's own first check, made before a JVM starts only to fail with a stack trace."""
    if text == "yarn" or text.startswith(("local", "spark://", "k8s://")):
        return text
    raise argparse.ArgumentTypeError(f"must be local[N], spark://HOST:PORT, k8s://... or yarn, not {text!r}")


def checkpoint_location(text: str) -> str:
    """A URL of another file system as it is; a local directory made and checked now."""
    location = urlparse(text)
    if location.scheme in ("", "file"):
        output_directory(location.path if location.scheme else text)
    return text


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    commands: argparse._SubParsersAction[Any] = parser.add_subparsers(dest="pipeline_command", required=True)

    run = commands.add_parser("run", help="run the payments pipeline on Spark")
    run.add_argument("--bootstrap", required=True, help="HOST:PORT of a Kafka-protocol broker")
    run.add_argument(
        "--master", type=spark_master, default="local[2]", help="Spark master: local[N] or spark://HOST:PORT"
    )
    run.add_argument(
        "--checkpoint",
        type=checkpoint_location,
        required=True,
        help="checkpoint directory or URL (hdfs://, s3a://...) of the queries",
    )
    run.add_argument("--db", required=True, help="balances store: a SQLite path or a postgresql:// URL")
    run.add_argument("--guarantee", choices=[EXACTLY_ONCE, AT_LEAST_ONCE], default=EXACTLY_ONCE)
    run.add_argument("--trigger-ms", type=positive_int, help="micro-batch interval (default: back to back)")
    run.add_argument("--max-offsets", type=positive_int, help="at most this many input offsets per batch")
    run.add_argument(
        "--until-idle", type=positive_float, metavar="SECONDS", help="stop once no new input came for SECONDS"
    )

    gen = commands.add_parser("generate", help=f"write seeded payment events to {INPUT_TOPIC!r}")
    gen.add_argument("--bootstrap", required=True, help="HOST:PORT of a Kafka-protocol broker")
    gen.add_argument("--count", type=positive_int, default=1000)
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--partitions", type=positive_int, default=4, help="of the topic, if it is created")


def run_pipeline_command(args: argparse.Namespace) -> int:
    """Errors a user can fix (a bad database target, an unreachable broker) are one line on
    stderr; so is a Ctrl-C, which PySpark turns into a KeyboardInterrupt (after cancelling the
    running jobs), often several as the session's shutdown meets a JVM the Ctrl-C also ended."""
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("onceflow pipeline: interrupted; run it again to resume from its checkpoint", file=sys.stderr)
        return 128 + signal.SIGINT
    except AdminError as error:
        print(f"onceflow pipeline: {error}", file=sys.stderr)
        return error.exit_code
    except (StoreError, KafkaException, ValueError) as error:
        print(f"onceflow pipeline: {error}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.pipeline_command == "generate":
        check_reachable(args.bootstrap, REACH_TIMEOUT_S)
        workload = generate(args.bootstrap, args.count, args.seed, args.partitions)
        committed = workload.committed()
        total = sum(workload.expected_balances().values())
        print(
            f"wrote {args.count} events to {INPUT_TOPIC!r}: {len(committed)} committed "
            f"({len(workload.expected_payments())} valid payments, {workload.expected_rejected()} invalid), "
            f"{args.count - len(committed)} aborted; expected total {total} cents"
        )
        return 0
    open_store(args.db).close()  # a bad target fails here, before Spark starts
    from onceflow.pipeline.job import run_pipeline  # imports pyspark: only when it runs

    check_reachable(args.bootstrap, REACH_TIMEOUT_S)

    return run_pipeline(
        PipelineSettings(
            bootstrap=args.bootstrap,
            checkpoint=args.checkpoint,
            db=args.db,
            master=args.master,
            guarantee=args.guarantee,
            trigger_ms=args.trigger_ms,
            max_offsets=args.max_offsets,
            until_idle_s=args.until_idle,
        )
    )
