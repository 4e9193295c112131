"""`onceflow topics list | create | describe | delete`, through confluent-kafka's AdminClient."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from confluent_kafka import TopicCollection
from confluent_kafka.admin import NewTopic

from onceflow.admin import confluent
from onceflow.admin.client import Cluster
from onceflow.admin.errors import UsageError
from onceflow.admin.render import Column, Report, Table

_PARTITION_COLUMNS = (
    Column("partition", "partition", justify="right"),
    Column("leader", "leader", justify="right"),
    Column("replicas", "replicas"),
    Column("isr", "isr"),
    Column("start_offset", "start offset", justify="right"),
    Column("end_offset", "end offset", justify="right"),
    Column("last_stable_offset", "LSO", justify="right"),
)


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    topics = commands.add_parser("topics", help="list, create, describe and delete topics")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")

    actions.add_parser("list", parents=[common], help="every topic and its partition count").set_defaults(
        run=list_topics
    )

    create = actions.add_parser("create", parents=[common], help="create a topic")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=-1, help="default: the broker's num.partitions")
    create.add_argument("--replication-factor", type=int, default=-1, help="default: the broker's default")
    create.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="a topic config, repeatable"
    )
    create.set_defaults(run=create_topic)

    describe = actions.add_parser(
        "describe", parents=[common], help="partitions, leaders and offsets (start, end, last stable)"
    )
    describe.add_argument("topics", nargs="+", metavar="TOPIC")
    describe.set_defaults(run=describe_topics)

    delete = actions.add_parser("delete", parents=[common], help="delete topics and their data")
    delete.add_argument("topics", nargs="+", metavar="TOPIC")
    delete.set_defaults(run=delete_topics)


def list_topics(args: argparse.Namespace) -> Report:
    # Metadata through the wire client: confluent-kafka's list_topics() does not say which are internal.
    with Cluster(args.bootstrap, args.timeout) as cluster:
        partitions = cluster.partitions()
    counts = Counter(p.topic for p in partitions)
    internal = {p.topic for p in partitions if p.internal}
    rows = [
        {"topic": topic, "partitions": counts[topic], "internal": topic in internal}
        for topic in sorted(counts)
    ]
    columns = (
        Column("topic", "topic"),
        Column("partitions", "partitions", justify="right"),
        Column("internal", "internal"),
    )
    return Report(rows, [Table(columns, rows, empty="no topics")])


def create_topic(args: argparse.Namespace) -> Report:
    configs = {}
    for assignment in args.config:
        key, separator, value = assignment.partition("=")
        if not separator or not key.strip():
            raise UsageError(f"--config wants KEY=VALUE, got {assignment!r}")
        configs[key.strip()] = value.strip()
    admin = confluent.connect(args.bootstrap, args.timeout)
    new_topic = NewTopic(
        args.topic,
        num_partitions=args.partitions,
        replication_factor=args.replication_factor,
        config=configs,
    )
    futures = admin.create_topics([new_topic], request_timeout=args.timeout, operation_timeout=args.timeout)
    confluent.wait(futures[args.topic], f"create topic {args.topic!r}", args.timeout)
    partitions = confluent.partition_count(admin, args.topic, args.timeout)
    row = {"topic": args.topic, "partitions": partitions, "configs": configs}
    columns = (
        Column("topic", "topic"),
        Column("partitions", "partitions", justify="right"),
        Column("configs", "configs", lambda value: ", ".join(f"{k}={v}" for k, v in value.items()) or "-"),
    )
    return Report(row, [Table(columns, [row])], [f"created topic {args.topic!r}"])


def describe_topics(args: argparse.Namespace) -> Report:
    admin = confluent.connect(args.bootstrap, args.timeout)
    futures = admin.describe_topics(
        TopicCollection(list(dict.fromkeys(args.topics))), request_timeout=args.timeout
    )
    descriptions = [
        confluent.wait(future, f"describe topic {name!r}", args.timeout, topic=name)
        for name, future in futures.items()
    ]
    partitions = [(d.name, p.id) for d in descriptions for p in d.partitions]
    start = confluent.offsets(admin, partitions, "earliest", args.timeout)
    end = confluent.offsets(admin, partitions, "latest", args.timeout)
    stable = confluent.offsets(admin, partitions, "stable", args.timeout)
    topics = []
    for description in descriptions:
        topics.append(
            {
                "topic": description.name,
                "topic_id": str(description.topic_id),
                "internal": description.is_internal,
                "partitions": [
                    {
                        "partition": p.id,
                        "leader": p.leader.id if p.leader is not None else None,
                        "replicas": [node.id for node in p.replicas],
                        "isr": [node.id for node in p.isr],
                        "start_offset": start[description.name, p.id],
                        "end_offset": end[description.name, p.id],
                        "last_stable_offset": stable[description.name, p.id],
                    }
                    for p in description.partitions
                ],
            }
        )
    tables = [
        Table(
            _PARTITION_COLUMNS, topic["partitions"], title=f"topic {topic['topic']} (id {topic['topic_id']})"
        )
        for topic in topics
    ]
    return Report(topics, tables)


def delete_topics(args: argparse.Namespace) -> Report:
    admin = confluent.connect(args.bootstrap, args.timeout)
    names = list(dict.fromkeys(args.topics))
    futures = admin.delete_topics(names, request_timeout=args.timeout, operation_timeout=args.timeout)
    for name in names:
        confluent.wait(futures[name], f"delete topic {name!r}", args.timeout, topic=name)
    return Report({"deleted": names}, notes=[f"deleted topic {name!r}" for name in names])
