"""`onceflow topics list | create | describe | delete | alter-config | delete-records`, through
confluent-kafka's AdminClient."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from onceflow.admin import confluent
from onceflow.admin.client import Cluster
from onceflow.admin.errors import UsageError
from onceflow.admin.render import Column, Report, Table

_PARTITION_COLUMNS = (
    Column("partition", "partition", justify="right"),
    Column("leader", "leader", lambda leader: "none" if leader is None else str(leader), justify="right"),
    Column("leader_epoch", "epoch", justify="right"),
    Column("replicas", "replicas"),
    Column("isr", "isr"),
    Column("offline_replicas", "offline"),
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

    alter = actions.add_parser(
        "alter-config", parents=[common], help="set or remove a topic's own configs (the others stay)"
    )
    alter.add_argument("topic")
    alter.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    alter.add_argument(
        "--delete", action="append", default=[], metavar="KEY", help="back to the default; repeatable"
    )
    alter.set_defaults(run=alter_config)

    delete_records = actions.add_parser(
        "delete-records", parents=[common], help="delete a partition's records below an offset"
    )
    delete_records.add_argument("topic")
    delete_records.add_argument(
        "--partition", type=int, action="append", default=[], help="repeatable; default: every partition"
    )
    delete_records.add_argument(
        "--before", type=int, required=True, metavar="OFFSET", help="the new start offset; -1: the end"
    )
    delete_records.set_defaults(run=delete_records_before)


def list_topics(args: argparse.Namespace) -> Report:
    # Metadata through the wire client: confluent-kafka's list_topics() does not say which are internal.
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
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


def _assignments(option: str, assignments: list[str]) -> dict[str, str]:
    configs = {}
    for assignment in assignments:
        key, separator, value = assignment.partition("=")
        if not separator or not key.strip():
            raise UsageError(f"{option} wants KEY=VALUE, got {assignment!r}")
        configs[key.strip()] = value.strip()
    return configs


def create_topic(args: argparse.Namespace) -> Report:
    configs = _assignments("--config", args.config)
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
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
    """Each topic's own configs and partitions: leader and its epoch, replicas, ISR, replicas on
    dead brokers, and the offsets. An offline partition (no leader) is shown with leader none and
    no offsets, not as a failure: its offsets can only be asked of a leader."""
    names = list(dict.fromkeys(args.topics))
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
        described = cluster.describe(names)  # AdminError for an unknown topic
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    led = [(p.topic, p.partition) for p in described if p.leader >= 0]
    offsets = {
        position: confluent.offsets(admin, led, position, args.timeout)
        for position in ("earliest", "latest", "stable")
    }
    configs = _own_configs(admin, names, args.timeout)
    topics = []
    for name in names:
        partitions = [p for p in described if p.topic == name]
        topics.append(
            {
                "topic": name,
                "topic_id": str(partitions[0].topic_id) if partitions else None,
                "internal": bool(partitions) and partitions[0].internal,
                "configs": configs[name],
                "partitions": [
                    {
                        "partition": p.partition,
                        "leader": p.leader if p.leader >= 0 else None,
                        "leader_epoch": p.leader_epoch,
                        "replicas": list(p.replicas),
                        "isr": list(p.isr),
                        "offline_replicas": list(p.offline_replicas),
                        "start_offset": offsets["earliest"].get((name, p.partition)),
                        "end_offset": offsets["latest"].get((name, p.partition)),
                        "last_stable_offset": offsets["stable"].get((name, p.partition)),
                    }
                    for p in partitions
                ],
            }
        )
    tables = [
        Table(
            _PARTITION_COLUMNS,
            topic["partitions"],
            title=f"topic {topic['topic']} (id {topic['topic_id']}), configs: "
            + (", ".join(f"{key}={value}" for key, value in topic["configs"].items()) or "none of its own"),
        )
        for topic in topics
    ]
    offline = [
        f"{topic['topic']}-{row['partition']}"
        for topic in topics
        for row in topic["partitions"]
        if row["leader"] is None
    ]
    notes = [f"offline (no leader): {', '.join(offline)}"] if offline else []
    return Report(topics, tables, notes)


def _own_configs(admin: Any, topics: list[str], timeout_s: float) -> dict[str, dict[str, str]]:
    """Each topic's own configs (DescribeConfigs' DYNAMIC_TOPIC_CONFIG), as kafka-topics shows them."""
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics]
    futures = admin.describe_configs(resources, request_timeout=timeout_s)
    own = {}
    for resource in resources:
        entries = confluent.wait(
            futures[resource], f"describe the configs of {resource.name!r}", timeout_s, topic=resource.name
        )
        own[resource.name] = {
            name: entry.value
            for name, entry in sorted(entries.items())
            if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        }
    return own


def delete_topics(args: argparse.Namespace) -> Report:
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    names = list(dict.fromkeys(args.topics))
    futures = admin.delete_topics(names, request_timeout=args.timeout, operation_timeout=args.timeout)
    for name in names:
        confluent.wait(futures[name], f"delete topic {name!r}", args.timeout, topic=name)
    return Report({"deleted": names}, notes=[f"deleted topic {name!r}" for name in names])


def alter_config(args: argparse.Namespace) -> Report:
    changes = _assignments("--set", args.set)
    if not changes and not args.delete:
        raise UsageError("nothing to change: give --set KEY=VALUE or --delete KEY")
    both = sorted(changes.keys() & set(args.delete))
    if both:
        raise UsageError(f"both set and deleted: {', '.join(both)}")
    entries = [
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET) for key, value in changes.items()
    ]
    entries += [
        ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE)
        for key in dict.fromkeys(args.delete)
    ]
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    resource = ConfigResource(ResourceType.TOPIC, args.topic, incremental_configs=entries)
    futures = admin.incremental_alter_configs([resource], request_timeout=args.timeout)
    confluent.wait(futures[resource], f"alter the configs of {args.topic!r}", args.timeout, topic=args.topic)
    described = ConfigResource(ResourceType.TOPIC, args.topic)
    configs = confluent.wait(
        admin.describe_configs([described], request_timeout=args.timeout)[described],
        f"describe the configs of {args.topic!r}",
        args.timeout,
        topic=args.topic,
    )
    own = {
        name: entry.value
        for name, entry in sorted(configs.items())
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }
    rows = [{"key": key, "value": value} for key, value in own.items()]
    columns = (Column("key", "key"), Column("value", "value"))
    return Report(
        {"topic": args.topic, "configs": own},
        [
            Table(
                columns,
                rows,
                title=f"configs of {args.topic} (its own)",
                empty="none: every key has its default",
            )
        ],
        [f"altered the configs of {args.topic!r}"],
    )


def delete_records_before(args: argparse.Namespace) -> Report:
    # The wire client's Metadata does not create the topic, as confluent-kafka's would.
    with Cluster(args.bootstrap, args.timeout, args.command_config) as cluster:
        every = [p.partition for p in cluster.partitions([args.topic])]  # AdminError when unknown
    partitions = list(dict.fromkeys(args.partition)) or every
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    wanted = [TopicPartition(args.topic, partition, args.before) for partition in partitions]
    futures = admin.delete_records(wanted, request_timeout=args.timeout, operation_timeout=args.timeout)
    rows = []
    for key, future in futures.items():
        deleted = confluent.wait(
            future, f"delete records of {key.topic}-{key.partition}", args.timeout, topic=args.topic
        )
        rows.append({"topic": key.topic, "partition": key.partition, "low_watermark": deleted.low_watermark})
    rows.sort(key=lambda row: row["partition"])
    columns = (
        Column("topic", "topic"),
        Column("partition", "partition", justify="right"),
        Column("low_watermark", "start offset", justify="right"),
    )
    return Report(
        rows, [Table(columns, rows)], [f"deleted records of {len(rows)} partition(s) of {args.topic!r}"]
    )
