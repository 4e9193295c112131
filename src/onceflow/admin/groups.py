"""`onceflow groups list | describe | reset-offsets | delete-offsets`, through confluent-kafka's
AdminClient."""

from __future__ import annotations

import argparse
from enum import Enum
from typing import Any

from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription
from kio.schema.errors import ErrorCode

from onceflow.admin import confluent
from onceflow.admin.client import Cluster, error_name
from onceflow.admin.errors import AdminError
from onceflow.admin.render import Column, Report, Table

_OFFSET_COLUMNS = (
    Column("topic", "topic"),
    Column("partition", "partition", justify="right"),
    Column("committed_offset", "committed", justify="right"),
    Column("end_offset", "end offset", justify="right"),
    Column("lag", "lag", justify="right"),
)


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    groups = commands.add_parser("groups", help="list and describe consumer groups, reset their offsets")
    actions = groups.add_subparsers(dest="action", required=True, metavar="ACTION")

    actions.add_parser("list", parents=[common], help="every consumer group and its state").set_defaults(
        run=list_groups
    )

    describe = actions.add_parser(
        "describe", parents=[common], help="a group's members, committed offsets and lag"
    )
    describe.add_argument("group")
    describe.set_defaults(run=describe_group)

    reset = actions.add_parser(
        "reset-offsets", parents=[common], help="move an inactive group's committed offsets"
    )
    reset.add_argument("group")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the first offset still in the log")
    target.add_argument("--to-latest", action="store_true", help="the end of the log")
    target.add_argument(
        "--to-offset", type=int, metavar="N", help="offset N, moved into the log's range if outside it"
    )
    reset.add_argument(
        "--topic",
        action="append",
        default=[],
        help="reset every partition of this topic (repeatable); default: the partitions with commits",
    )
    reset.add_argument("--dry-run", action="store_true", help="show the new offsets without committing them")
    reset.set_defaults(run=reset_offsets)

    delete = actions.add_parser(
        "delete-offsets", parents=[common], help="delete a group's committed offsets of a topic"
    )
    delete.add_argument("group")
    delete.add_argument("--topic", required=True)
    delete.add_argument(
        "--partition", type=int, action="append", default=[], help="repeatable; default: every partition"
    )
    delete.set_defaults(run=delete_offsets)


def _state_name(state: Enum | None) -> str:
    """Kafka's spelling: STABLE -> Stable, PREPARING_REBALANCING -> PreparingRebalancing."""
    if state is None:
        return "Unknown"
    return state.name.title().replace("_", "")


def list_groups(args: argparse.Namespace) -> Report:
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    result = confluent.wait(
        admin.list_consumer_groups(request_timeout=args.timeout), "list consumer groups", args.timeout
    )
    if result.errors and not result.valid:
        raise AdminError(f"cannot list consumer groups: {result.errors[0]}")
    rows = [
        {
            "group": listing.group_id,
            "state": _state_name(listing.state),
            "simple": listing.is_simple_consumer_group,
        }
        for listing in sorted(result.valid or [], key=lambda listing: listing.group_id)
    ]
    columns = (Column("group", "group"), Column("state", "state"), Column("simple", "simple"))
    return Report(rows, [Table(columns, rows, empty="no consumer groups")])


def _describe(admin: AdminClient, group: str, timeout_s: float) -> ConsumerGroupDescription:
    futures = admin.describe_consumer_groups([group], request_timeout=timeout_s)
    description: ConsumerGroupDescription = confluent.wait(
        futures[group], f"describe group {group!r}", timeout_s
    )
    return description


def _committed(admin: AdminClient, group: str, timeout_s: float) -> dict[tuple[str, int], int]:
    futures = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=timeout_s
    )
    result = confluent.wait(futures[group], f"read the offsets of group {group!r}", timeout_s)
    committed = {}
    for partition in result.topic_partitions or []:
        if partition.error is not None:
            raise AdminError(
                f"cannot read the offset of {partition.topic}-{partition.partition}: {partition.error.str()}"
            )
        if partition.offset >= 0:
            committed[partition.topic, partition.partition] = partition.offset
    return committed


def describe_group(args: argparse.Namespace) -> Report:
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    description = _describe(admin, args.group, args.timeout)
    committed = _committed(admin, args.group, args.timeout)
    if description.state == ConsumerGroupState.DEAD and not description.members and not committed:
        raise AdminError(f"unknown group {args.group!r}")
    members = [
        {
            "member_id": member.member_id,
            "client_id": member.client_id,
            "host": member.host,
            "instance_id": member.group_instance_id,
            "partitions": [f"{tp.topic}-{tp.partition}" for tp in member.assignment.topic_partitions],
        }
        for member in description.members
    ]
    assigned = {
        (tp.topic, tp.partition)
        for member in description.members
        for tp in member.assignment.topic_partitions
    }
    partitions = sorted(assigned | committed.keys())
    end = confluent.offsets(admin, partitions, "latest", args.timeout)
    offsets = [
        {
            "topic": topic,
            "partition": partition,
            "committed_offset": committed.get((topic, partition)),
            "end_offset": end[topic, partition],
            "lag": end[topic, partition] - committed[topic, partition]
            if (topic, partition) in committed
            else None,
        }
        for topic, partition in partitions
    ]
    coordinator = description.coordinator
    summary = {
        "group": description.group_id,
        "state": _state_name(description.state),
        "assignor": description.partition_assignor or None,
        "coordinator": f"{coordinator.id} ({coordinator.host}:{coordinator.port})" if coordinator else None,
    }
    summary_columns = tuple(Column(key, key) for key in summary)
    member_columns = (
        Column("member_id", "member"),
        Column("client_id", "client"),
        Column("host", "host"),
        Column("instance_id", "instance"),
        Column("partitions", "partitions"),
    )
    return Report(
        {**summary, "members": members, "offsets": offsets},
        [
            Table(summary_columns, [summary]),
            Table(member_columns, members, title="members", empty="no active members"),
            Table(_OFFSET_COLUMNS, offsets, title="offsets", empty="no committed offsets"),
        ],
    )


def reset_offsets(args: argparse.Namespace) -> Report:
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    description = _describe(admin, args.group, args.timeout)
    if description.members:
        raise AdminError(
            f"group {args.group!r} has {len(description.members)} active member(s) "
            f"(state {_state_name(description.state)}); offsets can only be reset while the group "
            "is inactive, so stop its consumers first"
        )
    before = _committed(admin, args.group, args.timeout)
    if args.topic:
        partitions = [
            (topic, partition)
            for topic in dict.fromkeys(args.topic)
            for partition in range(confluent.partition_count(admin, topic, args.timeout))
        ]
    else:
        partitions = sorted(before)
    if not partitions:
        raise AdminError(
            f"group {args.group!r} has no committed offsets; name the topics to reset with --topic"
        )
    earliest = confluent.offsets(admin, partitions, "earliest", args.timeout)
    latest = confluent.offsets(admin, partitions, "latest", args.timeout)
    if args.to_earliest:
        targets = {key: earliest[key] for key in partitions}
    elif args.to_latest:
        targets = {key: latest[key] for key in partitions}
    else:
        # As Kafka's tool does: an offset outside the log means its nearest end.
        targets = {key: min(max(args.to_offset, earliest[key]), latest[key]) for key in partitions}
    if args.dry_run:
        after = targets
    else:
        request = ConsumerGroupTopicPartitions(
            args.group,
            [TopicPartition(topic, partition, offset) for (topic, partition), offset in targets.items()],
        )
        futures = admin.alter_consumer_group_offsets([request], request_timeout=args.timeout)
        result = confluent.wait(
            futures[args.group], f"reset the offsets of group {args.group!r}", args.timeout
        )
        for answered in result.topic_partitions or []:
            if answered.error is not None:
                raise AdminError(
                    f"cannot reset {answered.topic}-{answered.partition}: {answered.error.str()}"
                )
        after = _committed(admin, args.group, args.timeout)
    rows = [
        {
            "topic": topic,
            "partition": partition,
            "before": before.get((topic, partition)),
            "after": after.get((topic, partition)),
        }
        for topic, partition in partitions
    ]
    columns = (
        Column("topic", "topic"),
        Column("partition", "partition", justify="right"),
        Column("before", "before", justify="right"),
        Column("after", "after", justify="right"),
    )
    note = (
        "dry run: nothing was committed"
        if args.dry_run
        else f"reset {len(rows)} partition(s) of {args.group!r}"
    )
    return Report(
        {"group": args.group, "dry_run": args.dry_run, "offsets": rows}, [Table(columns, rows)], [note]
    )


def delete_offsets(args: argparse.Namespace) -> Report:
    # OffsetDelete through the wire client: confluent-kafka's Python AdminClient has no binding.
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
        every = [p.partition for p in cluster.partitions([args.topic])]  # AdminError when unknown
        partitions = list(dict.fromkeys(args.partition)) or every
        errors = cluster.delete_offsets(args.group, [(args.topic, partition) for partition in partitions])
    for (topic, partition), error in sorted(errors.items()):
        if error != ErrorCode.none:
            raise AdminError(f"cannot delete the offset of {topic}-{partition}: {error_name(error)}")
    rows = [{"topic": args.topic, "partition": partition} for partition in partitions]
    columns = (Column("topic", "topic"), Column("partition", "partition", justify="right"))
    return Report(
        {"group": args.group, "deleted": rows},
        [Table(columns, rows)],
        [f"deleted the offsets of {len(rows)} partition(s) of {args.topic!r} in group {args.group!r}"],
    )
