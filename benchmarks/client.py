"""Load client for the benchmarks: one command per process, figures as one JSON line on stdout.

    client.py produce --bootstrap HOST:PORT --topic T --partitions 4 --record-size 1000 --records N
                      --linger-ms 5 [--commit-interval-ms 100 [--abort-every 10]]
    client.py consume --bootstrap HOST:PORT --topic T --partitions 4 --min-bytes N
    client.py read-to-end --bootstrap HOST:PORT --topic T --partitions 4 --isolation-level read_committed
    client.py latency --bootstrap HOST:PORT --topic T --partitions 4 --rate-bytes 10000000 --seconds 10
                      --warmup-seconds 1 --fetch-wait-ms 5
    client.py failover --bootstrap HOST:PORT,... --topic T --partitions 4 --partition 0 --kill-pid PID
                       --interval-ms 5 --warmup-seconds 2
    client.py connect --bootstrap HOST:PORT --connections 50 --mechanism SCRAM-SHA-256
                      --username U --password P

Every command but connect takes --client-config '{"security.protocol": "SSL", ...}'.
    client.py coordinator-failover --bootstrap HOST:PORT,... --topic T --partitions 4
                       --transactional-id ID --kill-pid PID --interval-ms 20 --warmup-seconds 2

The same code runs against the onceflow broker and the librdkafka mock cluster; only
`--bootstrap` differs. Topics are auto-created by a metadata request, so each broker decides
the partition count (`num.partitions` for onceflow, 4 on the mock) and the client checks it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import struct
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

_STAMP = struct.Struct(">q")
_METADATA_TIMEOUT_S = 30.0
_TRANSACTION_TIMEOUT_S = 60.0
_IDLE_TIMEOUT_S = 30.0
_FAILOVER_TIMEOUT_S = 60.0
# Both failover rows measure the brokers' failover, not librdkafka's reconnect back-off: after
# its coordinator's (or leader's) broker dies, librdkafka asks again who replaced it only after
# a reconnect attempt to the dead broker, and those attempts back off up to
# reconnect.backoff.max.ms (10 s by default). With the default, a coordinator failover measured
# either 3.3-4.6 s or 11.7-12 s, depending on whether the second attempt came before the
# election (about 3 s after the kill); capped at 1 s it measured 3.5-5.5 s.
_RECONNECT_BACKOFF_MAX_MS = 1000
# --client-config: what every client of the command adds to its settings (TLS, SASL).
_CLIENT_CONFIG: dict[str, Any] = {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("produce", "consume", "read-to-end", "latency", "failover", "coordinator-failover"):
        command = commands.add_parser(name)
        command.add_argument("--bootstrap", required=True)
        command.add_argument("--topic", required=True)
        command.add_argument("--partitions", type=int, required=True)
        command.add_argument(
            "--client-config", type=json.loads, default={}, help="librdkafka settings (TLS, SASL) as JSON"
        )
    connect_command = commands.add_parser("connect")
    connect_command.add_argument("--bootstrap", required=True)
    connect_command.add_argument("--connections", type=int, required=True)
    connect_command.add_argument("--mechanism", required=True, help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    connect_command.add_argument("--username", required=True)
    connect_command.add_argument("--password", required=True)
    produce_command = commands.choices["produce"]
    produce_command.add_argument("--record-size", type=int, required=True)
    produce_command.add_argument("--records", type=int, required=True)
    produce_command.add_argument("--linger-ms", type=int, required=True)
    produce_command.add_argument(
        "--commit-interval-ms", type=int, default=0, help="produce in transactions this long (0: none)"
    )
    produce_command.add_argument(
        "--abort-every", type=int, default=0, help="abort every N-th transaction, from the first (0: none)"
    )
    consume_command = commands.choices["consume"]
    consume_command.add_argument(
        "--min-bytes", type=int, required=True, help="read the log again until this much is read"
    )
    read_command = commands.choices["read-to-end"]
    read_command.add_argument(
        "--isolation-level", choices=("read_committed", "read_uncommitted"), required=True
    )
    latency_command = commands.choices["latency"]
    latency_command.add_argument("--record-size", type=int, default=1000)
    latency_command.add_argument("--rate-bytes", type=int, required=True, help="steady produce rate, bytes/s")
    latency_command.add_argument("--seconds", type=float, required=True, help="how long to measure")
    latency_command.add_argument("--warmup-seconds", type=float, required=True)
    latency_command.add_argument("--fetch-wait-ms", type=int, required=True)
    failover_command = commands.choices["failover"]
    failover_command.add_argument("--partition", type=int, required=True, help="the partition produced to")
    failover_command.add_argument("--kill-pid", type=int, required=True, help="the partition leader's pid")
    failover_command.add_argument("--interval-ms", type=float, required=True, help="one record per interval")
    failover_command.add_argument("--warmup-seconds", type=float, required=True, help="acks before the kill")
    coordinator_command = commands.choices["coordinator-failover"]
    coordinator_command.add_argument("--transactional-id", required=True)
    coordinator_command.add_argument("--kill-pid", type=int, required=True, help="its coordinator's pid")
    coordinator_command.add_argument(
        "--interval-ms", type=float, required=True, help="one transaction per interval"
    )
    coordinator_command.add_argument(
        "--warmup-seconds", type=float, required=True, help="commits before the kill"
    )
    args = parser.parse_args()
    _CLIENT_CONFIG.update(getattr(args, "client_config", {}))
    run = {
        "connect": connect,
        "produce": produce,
        "consume": consume,
        "read-to-end": read_to_end,
        "latency": latency,
        "failover": failover,
        "coordinator-failover": coordinator_failover,
    }[args.command]
    print(json.dumps(run(args)), flush=True)
    return 0


def connect(args: argparse.Namespace) -> dict[str, Any]:
    """Open `--connections` connections one after another, each logging in with SASL (over
    plaintext: the login alone is timed) through onceflow's own synchronous wire client, which
    asks only ApiVersions, SaslHandshake and SaslAuthenticate; each connection's time, from the
    TCP connect to the end of the login (the client's key derivation included)."""
    from onceflow.admin.client import BrokerConnection
    from onceflow.admin.login import client_login

    login = client_login(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": args.mechanism,
            "sasl.username": args.username,
            "sasl.password": args.password,
        }
    )
    seconds = []
    for _ in range(args.connections):
        started = time.perf_counter()
        connection = BrokerConnection(args.bootstrap, _METADATA_TIMEOUT_S, login)
        seconds.append(time.perf_counter() - started)
        connection.close()
    return {
        "connections": args.connections,
        "median_ms": statistics.median(seconds) * 1000,
        "max_ms": max(seconds) * 1000,
    }


def produce(args: argparse.Namespace) -> dict[str, Any]:
    """Send `--records` records round-robin over the partitions as fast as the producer takes them,
    idempotent with acks=all, and check that the broker's end offsets grew by as many.

    With `--commit-interval-ms`, the records go in transactions that end once they are that
    old, with a commit (or, every `--abort-every`-th from the first, an abort); the end offsets
    then also grow by the control record each transaction leaves in each partition it wrote to.
    """
    config = {
        "bootstrap.servers": args.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": args.linger_ms,
        **_CLIENT_CONFIG,
    }
    if args.commit_interval_ms:
        config["transactional.id"] = f"onceflow-benchmarks-{args.topic}"
    producer = Producer(config)
    wait_for_topic(producer, args.topic, args.partitions)
    offsets_before = end_offsets(args.bootstrap, args.topic, args.partitions)
    transactions = (
        Transactions(producer, args.partitions, args.commit_interval_ms / 1000, args.abort_every)
        if args.commit_interval_ms
        else None
    )
    payload = os.urandom(args.record_size)
    started = time.perf_counter()
    if transactions:
        transactions.begin(0)
    for index in range(args.records):
        if transactions and index % 100 == 0:
            transactions.renew_if_due(index)
        while True:
            try:
                producer.produce(args.topic, payload, partition=index % args.partitions)
                break
            except BufferError:
                # The local queue is full: the broker sets the pace from here on.
                producer.poll(0.001)
        if index % 1000 == 0:
            producer.poll(0)
    if transactions:
        transactions.end(args.records)
    unsent = producer.flush(300)
    seconds = time.perf_counter() - started
    if unsent:
        raise SystemExit(f"{unsent} records were still unsent after the flush timeout")
    control_records = transactions.control_records if transactions else 0
    stored = sum(end_offsets(args.bootstrap, args.topic, args.partitions)) - sum(offsets_before)
    if stored != args.records + control_records:
        raise SystemExit(
            f"sent {args.records} records and {control_records} transaction markers"
            f" but the broker's end offsets grew by {stored}"
        )
    figures = {"records": args.records, "bytes": args.records * args.record_size, "seconds": seconds}
    return {**figures, **transactions.figures()} if transactions else figures


class Transactions:
    """Cuts a run of `produce()` calls into transactions of `interval_s`, counting what each held."""

    def __init__(self, producer: Producer, partitions: int, interval_s: float, abort_every: int) -> None:
        self.producer = producer
        self.partitions = partitions
        self.interval_s = interval_s
        self.abort_every = abort_every
        self.committed = self.aborted = 0
        self.committed_records = self.aborted_records = self.control_records = 0
        self.seconds_flushing = self.seconds_ending = 0.0
        self._first_index = 0
        self._began_at = 0.0
        producer.init_transactions(_TRANSACTION_TIMEOUT_S)

    def begin(self, first_index: int) -> None:
        self.producer.begin_transaction()
        self._first_index = first_index
        self._began_at = time.perf_counter()

    def renew_if_due(self, next_index: int) -> None:
        """End the open transaction if it is `interval_s` old, and begin the next one."""
        if time.perf_counter() - self._began_at >= self.interval_s:
            self.end(next_index)
            self.begin(next_index)

    def end(self, next_index: int) -> None:
        """Commit (or abort) the open transaction, which holds the records up to `next_index`."""
        records = next_index - self._first_index
        # Round robin: the transaction wrote to min(records, partitions) partitions, one marker each.
        self.control_records += min(records, self.partitions)
        # commit_transaction() and abort_transaction() start by flushing (abort by dropping the
        # queued records); flushing first times the two steps apart, and puts the records of an
        # aborted transaction in the log, for a read_committed consumer to skip.
        started = time.perf_counter()
        self.producer.flush(_TRANSACTION_TIMEOUT_S)
        flushed = time.perf_counter()
        # From the first on, so that even a short run has an abort.
        if self.abort_every and (self.committed + self.aborted) % self.abort_every == 0:
            self.producer.abort_transaction(_TRANSACTION_TIMEOUT_S)
            self.aborted += 1
            self.aborted_records += records
        else:
            self.producer.commit_transaction(_TRANSACTION_TIMEOUT_S)
            self.committed += 1
            self.committed_records += records
        ended = time.perf_counter()
        self.seconds_flushing += flushed - started
        self.seconds_ending += ended - flushed

    def figures(self) -> dict[str, Any]:
        return {
            "transactions_committed": self.committed,
            "transactions_aborted": self.aborted,
            "records_committed": self.committed_records,
            "records_aborted": self.aborted_records,
            "control_records": self.control_records,
            "seconds_flushing_before_ending": self.seconds_flushing,
            "seconds_ending": self.seconds_ending,
        }


def consume(args: argparse.Namespace) -> dict[str, Any]:
    """Read every partition from its start to its end; repeat until `--min-bytes` were read.

    Repeating lets a broker that keeps only a window of its log (the mock cluster keeps a few
    MB per partition) be read for as many bytes as one that keeps everything.
    """
    consumer = Consumer(consumer_config(args.bootstrap))
    bounds = [
        consumer.get_watermark_offsets(TopicPartition(args.topic, partition), timeout=_METADATA_TIMEOUT_S)
        for partition in range(args.partitions)
    ]
    records_per_pass = sum(high - low for low, high in bounds)
    if records_per_pass == 0:
        raise SystemExit(f"topic {args.topic} is empty")
    records = payload_bytes = passes = 0
    started = time.perf_counter()
    while passes == 0 or payload_bytes < args.min_bytes:
        consumer.assign(
            [TopicPartition(args.topic, partition, low) for partition, (low, _) in enumerate(bounds)]
        )
        remaining = records_per_pass
        while remaining:
            # Asking for no more than what is left keeps the last call from waiting out its timeout.
            messages = consumer.consume(min(remaining, 10_000), timeout=30)
            if not messages:
                raise SystemExit(f"no records for 30 s with {remaining} of a pass still unread")
            for message in messages:
                if message.error():
                    raise KafkaException(message.error())
                payload_bytes += len(message.value())
            remaining -= len(messages)
            records += len(messages)
        passes += 1
    seconds = time.perf_counter() - started
    consumer.close()
    return {"records": records, "bytes": payload_bytes, "seconds": seconds, "passes": passes}


def read_to_end(args: argparse.Namespace) -> dict[str, Any]:
    """Read every partition once, from offset 0 to the end of the log for `--isolation-level`.

    The end is where the consumer reports partition EOF: the high watermark for
    read_uncommitted, the last stable offset for read_committed, which also drops the records
    of aborted transactions. The end offsets are queried in the same isolation level.
    """
    # EOF needs a fetch that comes back empty at the end, and the broker holds that one for
    # fetch.wait.max.ms (500 ms by default) first; while there is data, fetches return at once.
    settings = {
        "isolation.level": args.isolation_level,
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 10,
    }
    consumer = Consumer(consumer_config(args.bootstrap, settings))
    partitions = [TopicPartition(args.topic, partition, 0) for partition in range(args.partitions)]
    ends = [
        consumer.get_watermark_offsets(partition, timeout=_METADATA_TIMEOUT_S)[1] for partition in partitions
    ]
    unfinished = set(range(args.partitions))
    records = payload_bytes = 0
    started = last_message_at = time.perf_counter()
    consumer.assign(partitions)
    while unfinished:
        # A short wait: a batch call returns only when full or timed out, so the call that
        # takes the last EOF waits this out.
        messages = consumer.consume(10_000, timeout=0.01)
        now = time.perf_counter()
        if not messages:
            if now - last_message_at > _IDLE_TIMEOUT_S:
                raise SystemExit(
                    f"no records for {_IDLE_TIMEOUT_S:.0f} s before the end of {sorted(unfinished)}"
                )
            continue
        last_message_at = now
        for message in messages:
            error = message.error()
            if error is None:
                payload_bytes += len(message.value())
                records += 1
            elif error.code() == KafkaError._PARTITION_EOF:
                unfinished.discard(message.partition())
            else:
                raise KafkaException(error)
    seconds = time.perf_counter() - started
    # An empty partition reaches EOF without a fetched record, so its position stays unset (-1001).
    positions = [max(partition.offset, 0) for partition in consumer.position(partitions)]
    consumer.close()
    if positions != ends:
        raise SystemExit(f"stopped at offsets {positions}, but the ends were {ends}")
    return {"records": records, "bytes": payload_bytes, "seconds": seconds, "end_offsets": ends}


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """Produce at a steady rate and time each record from `produce()` to its arrival in the consumer.

    One thread does both, in 1 ms ticks: send the records that are due, then poll the consumer
    until the next tick. Both ends read the same monotonic clock, so no clock skew enters.
    """
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 0,
        }
    )
    wait_for_topic(producer, args.topic, args.partitions)
    consumer = Consumer(consumer_config(args.bootstrap, {"fetch.wait.max.ms": args.fetch_wait_ms}))
    starts = end_offsets(args.bootstrap, args.topic, args.partitions)
    consumer.assign(
        [TopicPartition(args.topic, partition, starts[partition]) for partition in range(args.partitions)]
    )
    padding = os.urandom(args.record_size - _STAMP.size)
    seconds_per_record = args.record_size / args.rate_bytes
    started = time.monotonic()
    measure_from_ns = int((started + args.warmup_seconds) * 1e9)
    stop_at = started + args.warmup_seconds + args.seconds
    sent = measured_sent = 0
    latencies_ns: list[int] = []

    def receive_until(deadline: float) -> None:
        while (remaining := deadline - time.monotonic()) > 0:
            # librdkafka counts whole milliseconds; rounding up avoids a busy loop on 0 ms polls.
            message = consumer.poll(max(remaining, 0.001))
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            received_ns = time.monotonic_ns()
            (sent_ns,) = _STAMP.unpack_from(message.value())
            if sent_ns >= measure_from_ns:
                latencies_ns.append(received_ns - sent_ns)

    while (now := time.monotonic()) < stop_at:
        due = int((now - started) / seconds_per_record)
        while sent < due:
            sent_ns = time.monotonic_ns()
            producer.produce(args.topic, _STAMP.pack(sent_ns) + padding, partition=sent % args.partitions)
            sent += 1
            measured_sent += sent_ns >= measure_from_ns
        producer.poll(0)
        receive_until(now + 0.001)
    sending_seconds = time.monotonic() - started
    drain_deadline = time.monotonic() + 10
    while len(latencies_ns) < measured_sent and time.monotonic() < drain_deadline:
        producer.poll(0)
        receive_until(time.monotonic() + 0.01)
    producer.flush(30)
    consumer.close()
    if len(latencies_ns) < 100:
        raise SystemExit(f"only {len(latencies_ns)} records arrived; cannot compute percentiles")
    percentiles = statistics.quantiles(latencies_ns, n=100, method="inclusive")
    return {
        "records_sent": sent,
        "records_measured": measured_sent,
        "records_received": len(latencies_ns),
        "achieved_bytes_per_s": sent * args.record_size / sending_seconds,
        "p50_ms": percentiles[49] / 1e6,
        "p99_ms": percentiles[98] / 1e6,
        "max_ms": max(latencies_ns) / 1e6,
        "mean_ms": statistics.fmean(latencies_ns) / 1e6,
    }


def failover(args: argparse.Namespace) -> dict[str, Any]:
    """Produce 1 KB records to one partition at a steady pace, acks=all, idempotent; after
    `--warmup-seconds` of acks, SIGKILL the partition's leader and time from the kill to the
    first ack of a record sent after it, which only a new leader can have written.

    The client kills, so the kill and the acks are stamped on one monotonic clock.
    """
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 0,
            "reconnect.backoff.max.ms": _RECONNECT_BACKOFF_MAX_MS,
        }
    )
    wait_for_topic(producer, args.topic, args.partitions)
    payload = os.urandom(1000)
    interval_s = args.interval_ms / 1000
    acks: list[tuple[float, float]] = []  # (sent, acked) monotonic seconds
    errors: list[str] = []

    def delivered(sent_at: float, error: KafkaError | None, _message: Any) -> None:
        if error is None:
            acks.append((sent_at, time.monotonic()))
        else:
            errors.append(str(error))

    started = time.monotonic()
    killed_at = 0.0
    sent = 0
    give_up_at = started + args.warmup_seconds + _FAILOVER_TIMEOUT_S
    while not (killed_at and acks and acks[-1][0] > killed_at):
        now = time.monotonic()
        if now > give_up_at:
            raise SystemExit(f"no ack of a record sent after the kill within {_FAILOVER_TIMEOUT_S:.0f} s")
        while sent < (now - started) / interval_s:
            producer.produce(
                args.topic,
                payload,
                partition=args.partition,
                on_delivery=functools.partial(delivered, time.monotonic()),
            )
            sent += 1
        if not killed_at and acks and now - started >= args.warmup_seconds:
            killed_at = time.monotonic()
            os.kill(args.kill_pid, signal.SIGKILL)
        producer.poll(interval_s)
    unsent = producer.flush(30)
    # Acks arrive in send order on one partition, so the first late-sent one is the first new-leader ack.
    first_new = next(acked_at for sent_at, acked_at in acks if sent_at > killed_at)
    before_kill = [acked_at for _, acked_at in acks if acked_at <= killed_at]
    return {
        "failover_s": first_new - killed_at,
        "last_ack_before_kill_s": (before_kill[-1] - killed_at) if before_kill else None,
        "records_sent": sent,
        "records_acked": len(acks),
        "records_unsent": unsent,
        "errors": errors,
    }


def coordinator_failover(args: argparse.Namespace) -> dict[str, Any]:
    """Commit a transaction of one record every `--interval-ms`; after `--warmup-seconds` of
    commits, SIGKILL the transactional id's coordinator and time from the kill to the first
    commit of a transaction begun after it, which only the partition's new leader, having loaded
    the transaction's state, can accept. A transaction the kill interrupts is aborted (or its
    producer started again, when the error is fatal) and the loop goes on, as an application's."""
    config = {
        "bootstrap.servers": args.bootstrap,
        "transactional.id": args.transactional_id,
        "linger.ms": 0,
        "reconnect.backoff.max.ms": _RECONNECT_BACKOFF_MAX_MS,
    }
    producer = Producer(config)
    wait_for_topic(producer, args.topic, args.partitions)
    producer.init_transactions(_TRANSACTION_TIMEOUT_S)
    interval_s = args.interval_ms / 1000
    started = time.monotonic()
    killed_at = 0.0
    committed_after: float | None = None
    commits = aborts = restarts = 0
    give_up_at = started + args.warmup_seconds + _FAILOVER_TIMEOUT_S
    while committed_after is None:
        if time.monotonic() > give_up_at:
            raise SystemExit(f"no transaction committed after the kill within {_FAILOVER_TIMEOUT_S:.0f} s")
        if not killed_at and commits and time.monotonic() - started >= args.warmup_seconds:
            killed_at = time.monotonic()
            os.kill(args.kill_pid, signal.SIGKILL)
        begun_at = time.monotonic()
        try:
            producer.begin_transaction()
            producer.produce(args.topic, b"x", partition=commits % args.partitions)
            committed = _commit_or_abort(producer)
        except KafkaException as exception:
            if not exception.args[0].fatal():
                raise
            restarts += 1  # fenced, say: a new session, as an application would start
            producer = Producer(config)
            producer.init_transactions(_TRANSACTION_TIMEOUT_S)
            committed = False
        if not committed:
            aborts += 1
            continue
        commits += 1
        if killed_at and begun_at > killed_at:
            committed_after = time.monotonic()
        time.sleep(max(0.0, begun_at + interval_s - time.monotonic()))
    return {
        "failover_s": committed_after - killed_at,
        "commits": commits,
        "aborts": aborts,
        "producer_restarts": restarts,
    }


def _commit_or_abort(producer: Producer) -> bool:
    """Commit, retrying what librdkafka calls retriable; abort what must be aborted (False)."""
    while True:
        try:
            producer.commit_transaction(_TRANSACTION_TIMEOUT_S)
            return True
        except KafkaException as exception:
            error = exception.args[0]
            if error.retriable():
                continue
            if not error.txn_requires_abort():
                raise
        producer.abort_transaction(_TRANSACTION_TIMEOUT_S)
        return False


def consumer_config(bootstrap: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    # Partitions are assigned by hand; the group id is only there because the client wants one.
    # librdkafka stops fetching a partition whose local queue holds queued.min.messages (100,000)
    # and looks again only fetch.queue.backoff.ms (1 s) later, so a reader that drains its
    # queue faster sat idle: 1,000,000 records of 100 B took 5.7 s with 1.5 s of client CPU and
    # 0.14 s of broker CPU; with 10 ms, 1.0 s.
    return {
        "bootstrap.servers": bootstrap,
        "group.id": "onceflow-benchmarks",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "fetch.queue.backoff.ms": 10,
        **_CLIENT_CONFIG,
        **(extra or {}),
    }


def wait_for_topic(producer: Producer, topic: str, partitions: int) -> None:
    """Auto-create `topic` with a metadata request and check the broker gave it `partitions`."""
    deadline = time.monotonic() + _METADATA_TIMEOUT_S
    while time.monotonic() < deadline:
        metadata = producer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics[topic]
        if metadata.error is None and metadata.partitions:
            if len(metadata.partitions) != partitions:
                raise SystemExit(f"{topic} has {len(metadata.partitions)} partitions, expected {partitions}")
            return
        time.sleep(0.1)
    raise SystemExit(f"{topic} was not created within {_METADATA_TIMEOUT_S:.0f} s")


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer(consumer_config(bootstrap))
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=_METADATA_TIMEOUT_S)[1]
            for partition in range(partitions)
        ]
    finally:
        consumer.close()


if __name__ == "__main__":
    sys.exit(main())
