"""The lab's client processes, run as `python -m onceflow.lab.workload ROLE ...` so they can be SIGKILLed.

- `producer` sends the values PREFIX-N given with --resend, then the unique values PREFIX-START ..
  PREFIX-(END-1), to the input topic at a steady rate;
- `worker` consumes the input in a group, writes each value to the output and commits per its preset;
- `hanger` opens a transaction, writes a few values, says "open" and waits to be killed.

None has recovery code: on any error a process exits and the lab starts it again, as after a crash.
Each one records what it did in its own history file (see `history.py`), transactional clients
each record the broker acknowledged in their open transaction and how the transaction ended as
they saw it (`transactions.py`): the checker judges aborted reads by that, not by the broker.

The lab's crashes land where they matter: on SIGUSR1 (or SIGUSR2) a producer or worker SIGKILLs
itself at its next crash point, recording a `crash` event first:
- a producer right after a send: a transactional one after flushing its transaction, before the
  commit (its records are in the log and the transaction will be aborted); a producer whose preset
  sends again what it never saw acknowledged once the broker has stored its in-flight sends but
  before it handled their acks (recorded as `unhandled-ack`), so its successor, a new producer
  session, sends them again; an at-most-once one at once;
- a worker before committing what it polled (after processing it, where the preset processes
  first), or on SIGUSR2 after committing and before processing, where the preset commits first.

On SIGURG a process stops (SIGSTOP) at its first crash point instead, recording `pause`, and goes
on where it stopped once the lab sends SIGCONT, recording `resume`: a zombie, which the lab
resumes after starting its successor.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from onceflow.client_watchdog import exit_if_stuck, records_or_exit
from onceflow.lab.history import HistoryWriter
from onceflow.lab.presets import PRESETS, Preset

# Client settings that keep recovery quick on loopback; they change no guarantee.
FAST_RECOVERY: dict[str, str | int | bool] = {
    "socket.timeout.ms": 3000,
    "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 200,
    "retry.backoff.ms": 20,
    # With one broker, every reset connection leaves a client with no broker up, so librdkafka
    # (2.16) re-bootstraps and decommissions it. A transactional producer then keeps the dead
    # handle as group coordinator and send_offsets_to_transaction hangs past its timeout
    # (librdkafka #5511, #5456), and a consumer can wait forever for its join's metadata.
    # Re-bootstrapping to the same single address gains nothing, so it is off.
    "metadata.recovery.strategy": "none",
}
TRANSACTION_SIZE = 5
BEFORE_COMMIT, BEFORE_OUTPUT = "before-commit", "before-output"


class CrashPoints:
    """Where the lab's signal asks this process to die: SIGUSR1 at its first point, SIGUSR2 at its
    second one (or the first, when it has one only). Installed before the history file is created:
    the lab signals a process only once that file exists."""

    def __init__(self, points: tuple[str, ...]) -> None:
        self.armed: str | None = None
        self.pausing = False
        signal.signal(signal.SIGUSR1, lambda _signal, _frame: self._arm(points[0]))
        signal.signal(signal.SIGUSR2, lambda _signal, _frame: self._arm(points[-1]))
        signal.signal(signal.SIGURG, lambda _signal, _frame: self._arm(points[0], pausing=True))

    def _arm(self, point: str, pausing: bool = False) -> None:
        self.armed = point
        self.pausing = pausing

    def due(self, point: str) -> bool:
        """Whether the process dies (not pauses) at `point` when it reaches it."""
        return self.armed == point and not self.pausing

    def reached(self, point: str, history: HistoryWriter) -> None:
        if self.armed != point:
            return
        if self.pausing:
            self.armed = None
            history.record("pause", point=point)
            os.kill(os.getpid(), signal.SIGSTOP)
            history.record("resume", point=point)
            return
        history.record("crash", point=point)
        os.kill(os.getpid(), signal.SIGKILL)


def producer_config(bootstrap: str, preset: Preset, transactional_id: str) -> dict[str, str | int | bool]:
    """The config of the producers and of the workers' output producers under `preset`."""
    config = {"bootstrap.servers": bootstrap, **FAST_RECOVERY, **preset.producer, "linger.ms": 5}
    if preset.transactional:
        config["transactional.id"] = transactional_id
    return config


def _producer(args: argparse.Namespace, preset: Preset, history: HistoryWriter, crash: CrashPoints) -> None:
    # Seeded per incarnation, so that a run repeats its aborts.
    aborts = random.Random(f"{args.seed}-{args.process}")
    producer = Producer(producer_config(args.bootstrap, preset, args.transactional_id))
    delivered: dict[str, tuple[int, int | None]] = {}
    dying = False  # at a crash point: acks come in that the application will never handle

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        value = _text(message)
        where = {"topic": args.topic, "value": value, "partition": message.partition()}
        where["offset"] = _offset(message)
        if error is not None:
            history.record("fail", topic=args.topic, value=value, error=str(error))
        elif preset.transactional:
            delivered[value] = (message.partition() or 0, _offset(message))
            history.record("written", **where)  # in the log, its transaction still open
        else:
            history.record("unhandled-ack" if dying else "ack", **where)

    if preset.transactional:
        producer.init_transactions(30)
    numbers = [*args.resend, *range(args.start, args.end)]
    step = TRANSACTION_SIZE if preset.transactional else 1
    interval = 1.0 / args.rate
    started = time.monotonic()
    for first in range(0, len(numbers), step):
        if preset.transactional:
            producer.begin_transaction()
        for position in range(first, min(first + step, len(numbers))):
            time.sleep(max(0.0, started + position * interval - time.monotonic()))
            value = f"{args.prefix}-{numbers[position]}"
            history.record("send", topic=args.topic, value=value)
            producer.produce(args.topic, key=value, value=value, on_delivery=on_delivery)
            if not preset.transactional:
                if preset.resends_unacknowledged and crash.due(BEFORE_COMMIT):
                    dying = True
                    producer.flush(10)  # stored by the broker, the acks never handled
                crash.reached(BEFORE_COMMIT, history)  # a send in flight, its ack not handled
            producer.poll(0)
        if preset.transactional:
            producer.flush(60)
            crash.reached(BEFORE_COMMIT, history)
            values = sorted(delivered)
            delivered_now = dict(delivered)
            delivered.clear()
            if aborts.random() < args.abort_rate:
                # Its records are in the log: read_committed readers must never see them.
                producer.abort_transaction(60)
                history.record("txn", topic=args.topic, outcome="aborted", values=values)
                continue
            _commit(producer, history, args.topic, values)
            # Acknowledged only now: before the commit, the values could still be aborted.
            for value, (partition, offset) in delivered_now.items():
                history.record("ack", topic=args.topic, value=value, partition=partition, offset=offset)
    if producer.flush(120) != 0:
        sys.exit(1)


def _commit(producer: Producer, history: HistoryWriter, topic: str, values: list[str]) -> None:
    """Commits the open transaction, recording the request and the answer as the client saw it."""
    history.record("commit-txn", topic=topic)
    try:
        producer.commit_transaction(60)
    except KafkaException as error:
        history.record("txn", topic=topic, outcome=_failed_outcome(error), values=values)
        raise
    history.record("txn", topic=topic, outcome="committed", values=values)


def _failed_outcome(error: KafkaException) -> str:
    code = error.args[0].code() if error.args and isinstance(error.args[0], KafkaError) else None
    fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    return "fenced" if code in fenced else "unknown"


def _worker(args: argparse.Namespace, preset: Preset, history: HistoryWriter, crash: CrashPoints) -> None:
    commits_first = preset.commit == "before-processing"
    isolation = str(preset.consumer["isolation.level"])
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            **FAST_RECOVERY,
            **preset.consumer,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            # Static membership (KIP-345): a restarted worker takes its partitions back at once.
            "group.instance.id": f"{args.group}-{args.slot}",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    producer = Producer(producer_config(args.bootstrap, preset, args.transactional_id))
    if preset.transactional:
        producer.init_transactions(30)

    on_written = _written_recorder(history, args.output)

    def on_assign(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        history.record("assign", topic=args.input, partitions=sorted(tp.partition for tp in partitions))

    consumer.subscribe([args.input], on_assign=on_assign)
    while True:
        messages = records_or_exit(consumer.consume(100, timeout=0.2))
        if not messages:
            continue
        history.record(
            "poll",
            topic=args.input,
            isolation=isolation,
            records=[[message.partition(), message.offset(), _text(message)] for message in messages],
        )
        offsets = _next_offsets(args.input, messages)
        if commits_first:
            crash.reached(BEFORE_COMMIT, history)
            consumer.commit(offsets=offsets, asynchronous=False)
            _record_commit(history, args.input, offsets)
            crash.reached(BEFORE_OUTPUT, history)
        time.sleep(args.processing_s)  # the work a real job does: a crash may land in it
        if preset.transactional:
            producer.begin_transaction()
        values = [_text(message) for message in messages]
        for value in values:
            producer.produce(
                args.output, key=value, value=value, on_delivery=on_written if preset.transactional else None
            )
        if preset.commit == "in-transaction":
            # The output reaches the log first, so that a crash here leaves an aborted transaction.
            producer.flush(60)
            crash.reached(BEFORE_COMMIT, history)
            try:
                with exit_if_stuck(30, "send_offsets_to_transaction"):
                    producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            except KafkaException as error:  # a zombie's successor fenced it
                outcome = _failed_outcome(error)
                history.record("txn", topic=args.output, outcome=outcome, values=sorted(values))
                raise
            _commit(producer, history, args.output, sorted(values))
            _record_commit(history, args.input, offsets)
        elif producer.flush(60) != 0:
            sys.exit(1)
        history.record("processed", topic=args.input, offsets=[[tp.partition, tp.offset] for tp in offsets])
        if preset.commit == "after-processing":
            crash.reached(BEFORE_COMMIT, history)
            consumer.commit(offsets=offsets, asynchronous=False)
            _record_commit(history, args.input, offsets)


def _hanger(args: argparse.Namespace, history: HistoryWriter) -> None:
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            **FAST_RECOVERY,
            "transactional.id": args.transactional_id,
            "transaction.timeout.ms": args.timeout_ms,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    on_written = _written_recorder(history, args.topic)
    for number in range(args.start, args.end):
        value = f"{args.prefix}-{number}"
        history.record("send", topic=args.topic, value=value)
        producer.produce(args.topic, key=value, value=value, on_delivery=on_written)
    producer.flush(30)
    print("open", flush=True)
    time.sleep(3600)


def _written_recorder(history: HistoryWriter, topic: str) -> Callable[[KafkaError | None, Message], None]:
    """A delivery callback that records each record of the open transaction the broker stored."""

    def on_written(error: KafkaError | None, message: Message) -> None:
        if error is None:
            where = {"partition": message.partition(), "offset": _offset(message)}
            history.record("written", topic=topic, value=_text(message), **where)

    return on_written


def _next_offsets(topic: str, messages: list[Message]) -> list[TopicPartition]:
    following: dict[int, int] = {}
    for message in messages:
        partition = message.partition() or 0
        following[partition] = max(following.get(partition, 0), (message.offset() or 0) + 1)
    return [TopicPartition(topic, partition, offset) for partition, offset in sorted(following.items())]


def _record_commit(history: HistoryWriter, topic: str, offsets: list[TopicPartition]) -> None:
    history.record("commit", topic=topic, offsets=[[tp.partition, tp.offset] for tp in offsets])


def _text(message: Message) -> str:
    value = message.value()
    return value.decode() if isinstance(value, bytes) else str(value)


def _offset(message: Message) -> int | None:
    offset = message.offset()
    return offset if offset is not None and offset >= 0 else None  # acks=0 learns no offset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m onceflow.lab.workload")
    parser.add_argument("role", choices=["producer", "worker", "hanger"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--history", required=True, type=Path)
    parser.add_argument("--process", required=True)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="exactly-once")
    parser.add_argument("--transactional-id", default="")
    parser.add_argument("--topic", default="input")
    parser.add_argument("--prefix", default="p")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument(
        "--resend", type=lambda text: [int(n) for n in text.split(",") if n], default=[], help="N1,N2,..."
    )
    parser.add_argument("--end", type=int, default=0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--timeout-ms", type=int, default=3000)
    parser.add_argument("--input", default="input")
    parser.add_argument("--output", default="output")
    parser.add_argument("--group", default="lab")
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--processing-s", type=float, default=0.05)
    parser.add_argument("--abort-rate", type=float, default=0.0, help="share of transactions aborted")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    commits_first = args.role == "worker" and preset.commit == "before-processing"
    crash = CrashPoints((BEFORE_COMMIT, BEFORE_OUTPUT) if commits_first else (BEFORE_COMMIT,))
    history = HistoryWriter(args.history, args.process)
    if args.role == "producer":
        _producer(args, preset, history, crash)
    elif args.role == "worker":
        _worker(args, preset, history, crash)
    else:
        _hanger(args, history)


if __name__ == "__main__":
    main()
