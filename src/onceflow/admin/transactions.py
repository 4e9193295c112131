"""`onceflow txn list | describe | describe-producers | find-hanging | abort`.

An open transaction pins the last stable offset (LSO) of every partition it wrote to, and
read_committed consumers stop there. A transaction whose producer died is aborted by the
coordinator after its timeout; one the coordinator lost track of (a "hanging" transaction)
pins the LSO until someone aborts it. These commands find such transactions and end them
with standard client calls only, so they work against Apache Kafka too.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer

from onceflow.admin import confluent
from onceflow.admin.client import Cluster, ProducerState, TransactionDescription, TransactionListing
from onceflow.admin.errors import AdminError, UsageError
from onceflow.admin.render import Column, Report, Table, duration, timestamp

_ONGOING = "Ongoing"
# Coordinator states in which the transaction is still open at the coordinator's end.
_OPEN_STATES = {_ONGOING, "PrepareCommit", "PrepareAbort", "PrepareEpochFence"}
_NO_MARKERS = (
    "that needs KIP-664's abort with WriteTxnMarkers, which onceflow txn does not send "
    "(kafka-transactions.sh does)"
)

_DESCRIPTION_COLUMNS = (
    Column("transactional_id", "transactional id"),
    Column("state", "state"),
    Column("producer_id", "producer id", justify="right"),
    Column("producer_epoch", "epoch", justify="right"),
    Column("timeout_ms", "timeout", duration, justify="right"),
    Column("start_time_ms", "started", timestamp),
    Column("age_ms", "age", duration, justify="right"),
    Column("partitions", "partitions"),
)


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    txn = commands.add_parser("txn", help="inspect transactions, find hanging ones and abort them")
    actions = txn.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", parents=[common], help="transactional ids known to the coordinators")
    listing.add_argument("--state", action="append", default=[], help="only this state (repeatable)")
    listing.add_argument(
        "--producer-id", type=int, action="append", default=[], help="only this producer id (repeatable)"
    )
    listing.set_defaults(run=list_transactions)

    describe = actions.add_parser(
        "describe", parents=[common], help="state, epoch, age and partitions of transactional ids"
    )
    describe.add_argument("transactional_ids", nargs="+", metavar="ID")
    describe.set_defaults(run=describe_transactions)

    producers = actions.add_parser(
        "describe-producers", parents=[common], help="the producers a partition knows, with open transactions"
    )
    producers.add_argument("topic")
    producers.add_argument("partition", type=int)
    producers.set_defaults(run=describe_producers)

    hanging = actions.add_parser(
        "find-hanging", parents=[common], help="open transactions on every partition, and which ones hang"
    )
    hanging.add_argument(
        "--older-than-ms", type=int, default=0, metavar="N", help="only transactions open longer than N ms"
    )
    hanging.add_argument("--topic", action="append", default=[], help="only this topic (repeatable)")
    hanging.set_defaults(run=find_hanging)

    abort = actions.add_parser(
        "abort",
        parents=[common],
        help="fence a transactional id and abort its open transaction",
        description="Abort by transactional id, or by partition: --topic, --partition and --producer-id "
        "together name an open transaction that describe-producers or find-hanging showed.",
    )
    abort.add_argument("transactional_id", nargs="?", metavar="ID")
    abort.add_argument("--topic")
    abort.add_argument("--partition", type=int)
    abort.add_argument("--producer-id", type=int)
    abort.set_defaults(run=abort_transaction)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _description_row(description: TransactionDescription, now_ms: int) -> dict[str, Any]:
    started = description.start_time_ms if description.start_time_ms >= 0 else None
    return {
        "transactional_id": description.transactional_id,
        "state": description.state,
        "producer_id": description.producer_id,
        "producer_epoch": description.producer_epoch,
        "timeout_ms": description.timeout_ms,
        "start_time_ms": started,
        "age_ms": None if started is None else now_ms - started,
        "partitions": [f"{topic}-{partition}" for topic, partition in description.partitions],
    }


def list_transactions(args: argparse.Namespace) -> Report:
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
        listings = cluster.list_transactions(args.state, args.producer_id)
    rows = [
        {
            "transactional_id": listing.transactional_id,
            "producer_id": listing.producer_id,
            "state": listing.state,
        }
        for listing in listings
    ]
    columns = (
        Column("transactional_id", "transactional id"),
        Column("producer_id", "producer id", justify="right"),
        Column("state", "state"),
    )
    return Report(rows, [Table(columns, rows, empty="no transactional ids")])


def describe_transactions(args: argparse.Namespace) -> Report:
    wanted = list(dict.fromkeys(args.transactional_ids))
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
        described = cluster.describe_transactions(wanted)
    missing = [transactional_id for transactional_id in wanted if transactional_id not in described]
    if missing:
        raise AdminError(f"unknown transactional id {', '.join(repr(name) for name in missing)}")
    now_ms = _now_ms()
    rows = [_description_row(described[transactional_id], now_ms) for transactional_id in wanted]
    return Report(rows, [Table(_DESCRIPTION_COLUMNS, rows)])


def describe_producers(args: argparse.Namespace) -> Report:
    key = (args.topic, args.partition)
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
        producers = cluster.describe_producers([key])[key]
    rows = [
        {
            "producer_id": producer.producer_id,
            "producer_epoch": producer.producer_epoch,
            "last_sequence": producer.last_sequence,
            "last_timestamp_ms": producer.last_timestamp_ms,
            "coordinator_epoch": producer.coordinator_epoch,
            "current_txn_start_offset": _open_offset(producer),
        }
        for producer in producers
    ]
    columns = (
        Column("producer_id", "producer id", justify="right"),
        Column("producer_epoch", "epoch", justify="right"),
        Column("last_sequence", "last sequence", justify="right"),
        Column("last_timestamp_ms", "last write", timestamp),
        Column("coordinator_epoch", "coordinator epoch", justify="right"),
        Column("current_txn_start_offset", "open txn from offset", justify="right"),
    )
    title = f"{args.topic}-{args.partition}"
    return Report(rows, [Table(columns, rows, title=title, empty="no active producers")])


def _open_offset(producer: ProducerState) -> int | None:
    offset = producer.current_txn_start_offset
    return offset if offset >= 0 else None


def _hanging_reason(
    partition: tuple[str, int],
    listing: TransactionListing | None,
    description: TransactionDescription | None,
    age_ms: int,
) -> str | None:
    """Why the open transaction will not end by itself, or None while it still may."""
    if listing is None:
        return "no coordinator knows this producer id"
    if description is None:
        return f"the coordinator no longer knows {listing.transactional_id!r}"
    if description.state not in _OPEN_STATES:
        return f"the coordinator has it {description.state}"
    if partition not in description.partitions:
        return "the coordinator's transaction does not include this partition"
    if age_ms > description.timeout_ms:
        return f"open longer than its timeout ({duration(description.timeout_ms)})"
    return None


def find_hanging(args: argparse.Namespace) -> Report:
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
        partitions = [
            (p.topic, p.partition) for p in cluster.partitions(args.topic or None) if not p.internal
        ]
        producers = cluster.describe_producers(partitions)
        open_transactions = [
            (partition, producer)
            for partition in sorted(producers)
            for producer in producers[partition]
            if producer.current_txn_start_offset >= 0
        ]
        listings: dict[int, TransactionListing] = {}
        descriptions: dict[str, TransactionDescription] = {}
        if open_transactions:
            producer_ids = sorted({producer.producer_id for _, producer in open_transactions})
            listings = {
                listing.producer_id: listing
                for listing in cluster.list_transactions(producer_ids=producer_ids)
            }
            descriptions = cluster.describe_transactions(
                listing.transactional_id for listing in listings.values()
            )
    pinned = sorted({partition for partition, _ in open_transactions})
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    stable = confluent.offsets(admin, pinned, "stable", args.timeout)
    end = confluent.offsets(admin, pinned, "latest", args.timeout)
    now_ms = _now_ms()
    rows = []
    for partition, producer in open_transactions:
        listing = listings.get(producer.producer_id)
        description = descriptions.get(listing.transactional_id) if listing else None
        if description and description.producer_id == producer.producer_id and description.start_time_ms >= 0:
            started = description.start_time_ms
        else:
            # Without the coordinator's start time, the partition's last write bounds the age from below.
            started = producer.last_timestamp_ms
        age_ms = now_ms - started
        if age_ms < args.older_than_ms:
            continue
        reason = _hanging_reason(partition, listing, description, age_ms)
        rows.append(
            {
                "topic": partition[0],
                "partition": partition[1],
                "producer_id": producer.producer_id,
                "producer_epoch": producer.producer_epoch,
                "transactional_id": listing.transactional_id if listing else None,
                "state": description.state if description else None,
                "start_offset": producer.current_txn_start_offset,
                "age_ms": age_ms,
                "last_stable_offset": stable[partition],
                "end_offset": end[partition],
                "lso_lag": end[partition] - stable[partition],
                "hanging": reason is not None,
                "reason": reason,
            }
        )
    columns = (
        Column("topic", "topic"),
        Column("partition", "partition", justify="right"),
        Column("producer_id", "producer id", justify="right"),
        Column("producer_epoch", "epoch", justify="right"),
        Column("transactional_id", "transactional id"),
        Column("state", "state"),
        Column("start_offset", "from offset", justify="right"),
        Column("age_ms", "age", duration, justify="right"),
        Column("last_stable_offset", "LSO", justify="right"),
        Column("end_offset", "end offset", justify="right"),
        Column("lso_lag", "LSO lag", justify="right"),
        Column("hanging", "hanging"),
        Column("reason", "why"),
    )
    hanging = sum(1 for row in rows if row["hanging"])
    notes = [f"{len(rows)} open transaction(s), {hanging} hanging"] if rows else []
    if hanging:
        notes.append(
            "abort one with: onceflow txn abort ID, "
            "or onceflow txn abort --topic T --partition P --producer-id X"
        )
    empty = "no open transactions"
    if args.older_than_ms > 0:
        empty += f" older than {duration(args.older_than_ms)}"
    return Report(rows, [Table(columns, rows, empty=empty)], notes)


def _transactional_id_of(cluster: Cluster, topic: str, partition: int, producer_id: int) -> str:
    producers = cluster.describe_producers([(topic, partition)])[topic, partition]
    if not any(p.producer_id == producer_id and p.current_txn_start_offset >= 0 for p in producers):
        raise AdminError(f"producer {producer_id} has no open transaction on {topic}-{partition}")
    listings = cluster.list_transactions(producer_ids=[producer_id])
    if not listings:
        raise AdminError(
            f"no transactional id is known for producer {producer_id}, so its transaction on "
            f"{topic}-{partition} cannot be ended through the coordinator; {_NO_MARKERS}"
        )
    return listings[0].transactional_id


def _fence(
    bootstrap: str, transactional_id: str, timeout_s: float, properties: Mapping[str, str] | None
) -> None:
    # A new session for the id makes the coordinator bump the epoch, which fences the old
    # producer, and abort what it left open; init_transactions returns once that is done.
    producer = Producer({**confluent.settings(bootstrap, properties), "transactional.id": transactional_id})
    try:
        producer.init_transactions(timeout_s)
    except KafkaException as error:
        raise AdminError(f"cannot fence {transactional_id!r}: {confluent.kafka_error_text(error)}") from error
    finally:
        producer.close()


def abort_transaction(args: argparse.Namespace) -> Report:
    by_partition = (args.topic, args.partition, args.producer_id)
    if args.transactional_id is not None and any(value is not None for value in by_partition):
        raise UsageError("give a transactional id or --topic/--partition/--producer-id, not both")
    if args.transactional_id is None and any(value is None for value in by_partition):
        raise UsageError("give a transactional id, or all three of --topic, --partition and --producer-id")
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
        transactional_id = args.transactional_id or _transactional_id_of(
            cluster, args.topic, args.partition, args.producer_id
        )
        before = cluster.describe_transactions([transactional_id]).get(transactional_id)
        if before is None:
            raise AdminError(f"unknown transactional id {transactional_id!r}")
        if args.transactional_id is None and (
            before.state != _ONGOING or (args.topic, args.partition) not in before.partitions
        ):
            raise AdminError(
                f"the coordinator's transaction of {transactional_id!r} ({before.state}) does not hold "
                f"{args.topic}-{args.partition} open, so fencing it would not end the transaction there; "
                f"{_NO_MARKERS}"
            )
        now_ms = _now_ms()
        if before.state != _ONGOING:
            # Prepare* finishes by itself; anything else has nothing open.
            row = _description_row(before, now_ms)
            note = f"{transactional_id!r} has no ongoing transaction ({before.state}); nothing to abort"
            return Report({"transactional_id": transactional_id, "aborted": False, "before": row}, [], [note])
        _fence(args.bootstrap, transactional_id, args.timeout, args.command_config)
        after = cluster.describe_transactions([transactional_id]).get(transactional_id)
    before_row = _description_row(before, now_ms)
    after_row = None if after is None else _description_row(after, _now_ms())
    rows = [{"when": "before", **before_row}]
    if after_row is not None:
        rows.append({"when": "after", **after_row})
    aborted = [f"{topic}-{partition}" for topic, partition in before.partitions]
    note = (
        f"aborted the open transaction of {transactional_id!r} on {', '.join(aborted) or 'no partitions'}; "
        f"producer epoch {before.producer_epoch} is fenced"
    )
    data = {
        "transactional_id": transactional_id,
        "aborted": True,
        "partitions": aborted,
        "before": before_row,
        "after": after_row,
    }
    return Report(data, [Table((Column("when", ""), *_DESCRIPTION_COLUMNS), rows)], [note])
