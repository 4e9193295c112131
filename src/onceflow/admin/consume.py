"""`onceflow consume TOPIC`: records to standard output, one a line, after Kafka's
kafka-console-consumer and kcat -C.

Without `--group` it reads the partitions given (default: all) from where it is told: the end
(the default, as Kafka's tool), `--from-beginning`, `--offset N` (N < 0: N records before the
end, as kcat), or `--timestamp MS` (the first record at or after that time), and commits
nothing. With `--group` it joins the group and commits what it printed, starting where the group
left off (else at the beginning with `--from-beginning`, at the end without). `--isolation-level
read_committed` hides aborted records and stops at the last stable offset.

It prints each value (`--print-key`: the key, the separator, the value; null as `null`), or
with `--format json` an object a line with topic, partition, offset, timestamp, key, value and
headers. It stops after `-n N` records, at the end of every partition with `--exit-at-end`,
when no record came for `--timeout` seconds, or on Ctrl-C.

Exit codes: 0 when it got what it was asked for (N records, or the end) or was stopped; 3 when
the timeout passed first (what came is printed); 1 for an unknown topic, an unreachable broker
or a consumer error; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from onceflow.admin import confluent
from onceflow.admin.client import Cluster, check_reachable
from onceflow.admin.errors import AdminError, UsageError
from onceflow.client_watchdog import is_fatal

TIMED_OUT = 3
_POLL_S = 0.2
_CONNECT_TIMEOUT_S = 10.0


def register(commands: argparse._SubParsersAction[Any], client: argparse.ArgumentParser) -> None:
    consume = commands.add_parser("consume", parents=[client], help="print a topic's records, one a line")
    consume.add_argument("topic")
    consume.add_argument("--group", help="join this consumer group and commit what is printed")
    consume.add_argument("--partition", type=int, action="append", default=[], help="repeatable (no --group)")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="from the first record")
    start.add_argument("--offset", type=int, help="from this offset; negative: that many before the end")
    start.add_argument(
        "--timestamp", type=int, metavar="MS", help="from the first record at or after this time (ms)"
    )
    consume.add_argument(
        "--isolation-level", choices=("read_uncommitted", "read_committed"), default="read_uncommitted"
    )
    consume.add_argument("-n", "--max-messages", type=int, metavar="N", help="stop after N records")
    consume.add_argument("--exit-at-end", action="store_true", help="stop at the end of every partition")
    consume.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="stop (exit 3) when no record came for this long"
    )
    consume.add_argument("--format", choices=("lines", "json"), default="lines")
    consume.add_argument("--print-key", action="store_true", help="the key, the separator, then the value")
    consume.add_argument(
        "--key-separator", default="\t", metavar="SEP", help="with --print-key (default: a tab)"
    )
    consume.set_defaults(run=run_consume, action=None)


def run_consume(args: argparse.Namespace) -> int:
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError("-n wants a positive count")
    if args.group is not None and (args.partition or args.offset is not None or args.timestamp is not None):
        raise UsageError("--group reads where the group left off: no --partition, --offset or --timestamp")
    check_reachable(args.bootstrap, _CONNECT_TIMEOUT_S)
    settings = {
        **confluent.settings(args.bootstrap, args.command_config),
        "group.id": args.group or "onceflow-consume",
        "enable.auto.commit": args.group is not None,
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "isolation.level": args.isolation_level,
        "enable.partition.eof": args.exit_at_end,
    }
    try:
        consumer = Consumer(settings)
    except KafkaException as error:
        raise AdminError(f"cannot configure the consumer: {confluent.kafka_error_text(error)}") from error
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _consume(consumer, args, _printer(args))
    except BrokenPipeError:
        # The reader (e.g. `head`) left: point stdout at nothing so the exit flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        consumer.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _consume(consumer: Consumer, args: argparse.Namespace, show: Callable[[Message], None]) -> int:
    at_end: set[int] = set()
    if args.group is not None:
        consumer.subscribe([args.topic])
        partitions = None
    else:
        partitions = _assign(consumer, args)
    stop = _stop_on_signals()
    printed = 0
    last_record = time.monotonic()
    while not stop:
        message = consumer.poll(_POLL_S)
        if message is None:
            if args.timeout is not None and time.monotonic() - last_record >= args.timeout:
                print(
                    f"onceflow consume: no record for {args.timeout:g} s ({printed} printed)", file=sys.stderr
                )
                return TIMED_OUT
            continue
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition() or 0)
                assigned = partitions or [tp.partition for tp in consumer.assignment()]
                if assigned and at_end >= set(assigned):
                    return 0
                continue
            if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise AdminError(f"unknown topic {args.topic!r}")
            if is_fatal(error):
                raise AdminError(error.str())
            continue  # librdkafka retries what is not fatal (a broker down a moment, say)
        at_end.discard(message.partition() or 0)
        last_record = time.monotonic()
        show(message)
        printed += 1
        if args.max_messages is not None and printed >= args.max_messages:
            break
    return 0  # with --group, closing the consumer commits what was printed


def _assign(consumer: Consumer, args: argparse.Namespace) -> list[int]:
    """Assign the partitions asked for, each from where `args` says; return them."""
    with Cluster(args.bootstrap, _CONNECT_TIMEOUT_S, args.command_config) as cluster:
        every = [p.partition for p in cluster.partitions([args.topic])]  # AdminError when unknown
    wanted = list(dict.fromkeys(args.partition)) or every
    missing = sorted(set(wanted) - set(every))
    if missing:
        raise AdminError(f"topic {args.topic!r} has no partition {missing[0]} (it has {len(every)})")
    if args.timestamp is not None:
        asked = [TopicPartition(args.topic, partition, args.timestamp) for partition in wanted]
        found = consumer.offsets_for_times(asked, timeout=_CONNECT_TIMEOUT_S)
        # No record at or after that time: the end, where the next one will be.
        starts = [
            TopicPartition(p.topic, p.partition, p.offset if p.offset >= 0 else OFFSET_END) for p in found
        ]
    elif args.offset is not None and args.offset < 0:
        starts = []
        for partition in wanted:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(args.topic, partition), timeout=_CONNECT_TIMEOUT_S
            )
            starts.append(TopicPartition(args.topic, partition, max(low, high + args.offset)))
    else:
        start = OFFSET_END if args.offset is None else args.offset
        if args.from_beginning:
            start = OFFSET_BEGINNING
        starts = [TopicPartition(args.topic, partition, start) for partition in wanted]
    consumer.assign(starts)
    return wanted


def _printer(args: argparse.Namespace) -> Callable[[Message], None]:
    out = sys.stdout.buffer
    separator = args.key_separator.encode()

    def lines(message: Message) -> None:
        value = message.value()
        line = b"null" if value is None else value
        if args.print_key:
            key = message.key()
            line = (b"null" if key is None else key) + separator + line
        out.write(line + b"\n")
        out.flush()

    def as_json(message: Message) -> None:
        _, timestamp = message.timestamp()
        record = {
            "topic": message.topic(),
            "partition": message.partition(),
            "offset": message.offset(),
            "timestamp": timestamp,
            "key": _text(message.key()),
            "value": _text(message.value()),
            "headers": [[name, _text(value)] for name, value in _headers(message)],
        }
        out.write(json.dumps(record).encode() + b"\n")
        out.flush()

    return as_json if args.format == "json" else lines


def _text(value: str | bytes | None) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _headers(message: Message) -> list[tuple[str, str | bytes | None]]:
    headers = message.headers() or []
    return list(headers.items() if isinstance(headers, dict) else headers)


class _Stop:
    """Set by SIGINT or SIGTERM: the loop ends, the consumer leaves its group and commits."""

    def __init__(self) -> None:
        self.stopped = False

    def __bool__(self) -> bool:
        return self.stopped


def _stop_on_signals() -> _Stop:
    stop = _Stop()

    def handler(_signum: int, _frame: object) -> None:
        stop.stopped = True

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
    return stop
