"""`onceflow produce TOPIC`: records from standard input, one a line, after Kafka's
kafka-console-producer and kcat -P.

A line is the value; with `--key-separator SEP` the text before the first SEP is the key (a line
without it is an error, as in Kafka's tool); `--format json` reads one object a line with `value`
and optionally `key`, `headers` (an object or a list of pairs), `partition` and `timestamp` (ms).
`--header K=V` adds headers to every record. Records go out idempotently with acks=all unless
`--acks` says otherwise; with `--transactional-id` they are written in transactions of
`--transaction-size` records (default: all of them in one), committed at the end of the input
and aborted on any failure, so a read_committed reader sees all of a transaction or none of it.

Exit codes: 0 when every record was acknowledged, 1 when one was not (the line says how many
and why) or the broker cannot be reached, 2 for bad arguments or input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from confluent_kafka import KafkaError, KafkaException, Producer

from onceflow.admin import confluent
from onceflow.admin.client import check_reachable
from onceflow.admin.errors import AdminError, UsageError

_ACKS = {"all": "all", "1": "1", "0": "0"}


@dataclass(frozen=True)
class Record:
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int | None = None
    timestamp: int | None = None


def register(commands: argparse._SubParsersAction[Any], client: argparse.ArgumentParser) -> None:
    produce = commands.add_parser(
        "produce", parents=[client], help="write standard input to a topic, one record a line"
    )
    produce.add_argument("topic")
    produce.add_argument("--key-separator", metavar="SEP", help="the text before SEP is the key")
    produce.add_argument(
        "--header", action="append", default=[], metavar="KEY=VALUE", help="on every record; repeatable"
    )
    produce.add_argument("--partition", type=int, help="this partition (default: by key, or spread)")
    produce.add_argument("--format", choices=("lines", "json"), default="lines", help="of standard input")
    produce.add_argument("--acks", choices=tuple(_ACKS), default="all")
    produce.add_argument("--transactional-id", metavar="ID", help="write in transactions under this id")
    produce.add_argument(
        "--transaction-size", type=int, metavar="N", help="commit every N records (default: all in one)"
    )
    produce.add_argument(
        "--timeout", type=float, default=30.0, metavar="SECONDS", help="for each record to be acknowledged"
    )
    produce.set_defaults(run=run_produce, action=None)


def run_produce(args: argparse.Namespace) -> int:
    if args.transaction_size is not None and (args.transactional_id is None or args.transaction_size < 1):
        raise UsageError("--transaction-size needs --transactional-id and a positive count")
    if args.transactional_id is not None and args.acks != "all":
        raise UsageError("a transactional producer writes with --acks all")
    headers = [_header(text) for text in args.header]
    check_reachable(args.bootstrap, args.timeout)
    settings = {
        **confluent.settings(args.bootstrap, args.command_config),
        "acks": _ACKS[args.acks],
        "enable.idempotence": args.acks == "all",
        "linger.ms": 5,
        "message.timeout.ms": int(args.timeout * 1000),
    }
    if args.transactional_id is not None:
        settings["transactional.id"] = args.transactional_id
    try:
        producer = Producer(settings)
    except KafkaException as error:
        raise AdminError(f"cannot configure the producer: {confluent.kafka_error_text(error)}") from error
    writer = _Writer(producer, args.topic, args.timeout, args.transactional_id is not None)
    records = _records(sys.stdin.buffer, args.format, args.key_separator, headers, args.partition)
    writer.write_all(records, args.transaction_size)
    return 0


class _Writer:
    def __init__(self, producer: Producer, topic: str, timeout_s: float, transactional: bool) -> None:
        self._producer = producer
        self._topic = topic
        self._timeout_s = timeout_s
        self._transactional = transactional
        self._sent = 0
        self._failed: list[KafkaError] = []

    def write_all(self, records: Iterator[Record], transaction_size: int | None) -> None:
        """Send every record; raises AdminError (after aborting an open transaction) when one
        was not acknowledged, or UsageError for a bad line."""
        if self._transactional:
            self._call(self._producer.init_transactions, self._timeout_s)
            self._call(self._producer.begin_transaction)
        in_transaction = 0
        try:
            for record in records:
                self._send(record)
                in_transaction += 1
                if self._transactional and in_transaction == transaction_size:
                    self._commit()
                    self._call(self._producer.begin_transaction)
                    in_transaction = 0
        except BaseException:
            if self._transactional:
                self._abort()
            else:
                self._producer.flush(self._timeout_s)
            raise
        if self._transactional:
            self._commit()
        else:
            self._flush()

    def _send(self, record: Record) -> None:
        fields: dict[str, Any] = {"value": record.value, "key": record.key, "headers": record.headers or None}
        if record.partition is not None:
            fields["partition"] = record.partition
        if record.timestamp is not None:
            fields["timestamp"] = record.timestamp
        while True:
            try:
                self._producer.produce(self._topic, on_delivery=self._delivered, **fields)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.1)
            except KafkaException as error:
                why = confluent.kafka_error_text(error)
                raise AdminError(f"cannot send to {self._topic!r}: {why}") from error
        self._sent += 1
        self._producer.poll(0)

    def _delivered(self, error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            self._failed.append(error)

    def _flush(self) -> None:
        left = self._producer.flush(self._timeout_s)
        if self._failed or left:
            why = self._failed[0].str() if self._failed else f"no answer within {self._timeout_s:g} s"
            raise AdminError(f"{len(self._failed) + left} of {self._sent} records not delivered: {why}")

    def _commit(self) -> None:
        self._flush()  # a record that failed aborts the transaction rather than commit a gap
        self._call(self._producer.commit_transaction, self._timeout_s)

    def _abort(self) -> None:
        with contextlib.suppress(KafkaException):  # the error that led here is the one to report
            self._producer.abort_transaction(self._timeout_s)

    def _call(self, method: Any, *arguments: Any) -> None:
        try:
            method(*arguments)
        except KafkaException as error:
            raise AdminError(f"transaction: {confluent.kafka_error_text(error)}") from error


def _header(text: str) -> tuple[str, bytes]:
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise UsageError(f"--header wants KEY=VALUE, got {text!r}")
    return key, value.encode()


def _records(
    source: BinaryIO,
    form: str,
    key_separator: str | None,
    headers: list[tuple[str, bytes]],
    partition: int | None,
) -> Iterator[Record]:
    separator = None if key_separator is None else key_separator.encode()
    for number, raw in enumerate(source, start=1):
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if form == "json":
            if not line.strip():
                continue
            record = _json_record(number, line)
            yield Record(
                record.value,
                record.key,
                headers + record.headers,
                record.partition if record.partition is not None else partition,
                record.timestamp,
            )
            continue
        key = None
        if separator is not None:
            key, found, line = line.partition(separator)
            if not found:
                raise UsageError(f"line {number} has no key separator {key_separator!r}")
        yield Record(line, key, headers, partition)


def _json_record(number: int, line: bytes) -> Record:
    try:
        fields = json.loads(line)
        if not isinstance(fields, dict) or "value" not in fields:
            raise ValueError("expected an object with a value")
        headers = fields.get("headers") or []
        pairs = headers.items() if isinstance(headers, dict) else headers
        return Record(
            value=_bytes(fields["value"]),
            key=_bytes(fields.get("key")),
            headers=[(str(name), _bytes(value) or b"") for name, value in pairs],
            partition=None if fields.get("partition") is None else int(fields["partition"]),
            timestamp=None if fields.get("timestamp") is None else int(fields["timestamp"]),
        )
    except (ValueError, TypeError) as error:
        raise UsageError(f"line {number} is not a record: {error}") from None


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return (value if isinstance(value, str) else json.dumps(value)).encode()
