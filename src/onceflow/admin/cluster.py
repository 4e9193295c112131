"""`onceflow cluster status`: a cluster's brokers, controller, and under-replicated and offline
partitions, read from its ZooKeeper (where Kafka's own tools of the ZooKeeper era looked too).
`onceflow cluster run`: a local cluster in the foreground (`cluster.launcher`).
`onceflow cluster elect-leaders`: preferred or unclean leader elections (ElectLeaders), as
Kafka's kafka-leader-election.sh asks for them."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition

from onceflow.admin import confluent
from onceflow.admin.client import parse_address
from onceflow.admin.errors import AdminError, UsageError
from onceflow.admin.render import Column, Report, Table
from onceflow.cluster.errors import ClusterError
from onceflow.cluster.status import ClusterStatus, PartitionHealth, cluster_status
from onceflow.cluster.znodes import NO_LEADER
from onceflow.extras import MissingExtraError, require


def register(commands: argparse._SubParsersAction[Any], common: argparse.ArgumentParser) -> None:
    cluster = commands.add_parser("cluster", help="a ZooKeeper-coordinated cluster of brokers")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = actions.add_parser(
        "status", help="brokers, the controller, under-replicated and offline partitions, coordinators"
    )
    status.add_argument(
        "--zookeeper", required=True, metavar="HOST:PORT", help="the cluster's ZooKeeper (zookeeper.connect)"
    )
    status.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="G",
        help="name the coordinator of group G (repeatable)",
    )
    status.add_argument(
        "--transactional-id",
        action="append",
        default=[],
        metavar="T",
        help="name the coordinator of transactional id T (repeatable)",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    status.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS", help="how long to wait for ZooKeeper"
    )
    status.set_defaults(run=show_status)
    run = actions.add_parser(
        "run", help="start ZooKeeper and N brokers on 127.0.0.1, in the foreground until Ctrl-C"
    )
    run.add_argument("--brokers", type=int, default=3, metavar="N", help="how many brokers (default 3)")
    run.add_argument(
        "--data-dir", type=Path, required=True, help="broker-N/ and broker-N.log per broker, zookeeper/"
    )
    run.add_argument(
        "--metrics",
        type=_metrics_address,
        metavar="HOST:PORT",
        help="broker N serves Prometheus metrics on PORT + N - 1 (PORT 0: each a free port)",
    )
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config key for every broker"
    )
    run.add_argument(
        "--security",
        choices=("sasl_ssl",),
        help="SASL_SSL only, with ACLs: makes a CA, certificates and an admin user under DATA_DIR/security",
    )
    run.set_defaults(foreground=run_cluster_command)
    elect = actions.add_parser(
        "elect-leaders", parents=[common], help="move leadership to preferred replicas, or elect unclean"
    )
    elect.add_argument("--election", choices=("preferred", "unclean"), default="preferred")
    elect.add_argument("--topic", help="the partitions of this topic (or --all)")
    elect.add_argument("--partition", type=int, action="append", default=[], help="repeatable; with --topic")
    elect.add_argument("--all", action="store_true", help="every partition of the cluster")
    elect.set_defaults(run=elect_leaders)


def run_cluster_command(args: argparse.Namespace) -> int:
    """Runs until SIGTERM or Ctrl-C; errors are one line on stderr (exit 2: bad input)."""
    from onceflow.cluster.launcher import BrokerOptions, LaunchError, run_cluster

    try:
        require("onceflow cluster run", "kazoo", "cluster", ("kazoo",))
        if args.security is not None:
            require("onceflow cluster run --security", "cryptography", "security", ("cryptography",))
        options = BrokerOptions(args.metrics, args.set, args.security)
        return run_cluster(args.brokers, args.data_dir, lambda line: print(line, flush=True), options)
    except (LaunchError, MissingExtraError) as error:
        print(f"onceflow cluster run: {error}", file=sys.stderr)
        return error.exit_code if isinstance(error, LaunchError) else 1


def _metrics_address(text: str) -> tuple[str, int]:
    try:
        host, port = parse_address(text)
    except AdminError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if port > 65535:
        raise argparse.ArgumentTypeError(f"no port {port}")
    return host, port


def elect_leaders(args: argparse.Namespace) -> Report:
    """Elected partitions and those that needed no election are success; any other outcome fails
    the command (exit 1) with one line naming each such partition and why."""
    if args.all == (args.topic is not None) or (args.partition and args.topic is None):
        raise UsageError("give --topic T [--partition P ...], or --all")
    admin = confluent.connect(args.bootstrap, args.timeout, args.command_config)
    partitions = None
    if args.topic is not None:
        numbers = args.partition or range(confluent.partition_count(admin, args.topic, args.timeout))
        partitions = [TopicPartition(args.topic, number) for number in dict.fromkeys(numbers)]
    election = ElectionType.PREFERRED if args.election == "preferred" else ElectionType.UNCLEAN
    # No timeout arguments: confluent-kafka 2.16's elect_leaders raises SystemError on them.
    future = admin.elect_leaders(election, partitions)
    results = confluent.wait(future, f"elect leaders ({args.election})", args.timeout, topic=args.topic)
    rows, failed = [], []
    for key, error in sorted(results.items(), key=lambda item: (item[0].topic, item[0].partition)):
        detail = error.args[0] if isinstance(error, KafkaException) and error.args else error
        if detail is None:
            outcome = "elected"
        elif isinstance(detail, KafkaError) and detail.code() == KafkaError.ELECTION_NOT_NEEDED:
            outcome = "no election needed"
        else:
            text = detail.str() if isinstance(detail, KafkaError) else str(detail)
            failed.append(f"{key.topic}-{key.partition}: {text}")
            continue
        rows.append({"topic": key.topic, "partition": key.partition, "outcome": outcome})
    if failed:
        raise AdminError(f"{len(failed)} partition(s) not elected: {'; '.join(failed)}")
    columns = (
        Column("topic", "topic"),
        Column("partition", "partition", justify="right"),
        Column("outcome", "outcome"),
    )
    note = f"{sum(row['outcome'] == 'elected' for row in rows)} partition(s) elected ({args.election})"
    return Report(rows, [Table(columns, rows, empty="no partition needed an election")], [note])


def show_status(args: argparse.Namespace) -> Report:
    try:
        require("onceflow cluster status", "kazoo", "cluster", ("kazoo",))
    except MissingExtraError as error:
        raise AdminError(str(error)) from error
    from onceflow.cluster.zk import read_cluster  # kazoo, only when asked

    # kazoo logs every failed connection attempt (Python's last-resort handler prints them);
    # the command says why it failed in one line.
    kazoo_log = logging.getLogger("kazoo")
    if not kazoo_log.handlers:
        kazoo_log.addHandler(logging.NullHandler())
    try:
        status = cluster_status(read_cluster(args.zookeeper, args.timeout), args.group, args.transactional_id)
    except ClusterError as error:
        raise AdminError(str(error)) from error
    return status_report(status)


def status_report(status: ClusterStatus) -> Report:
    controller = None if status.controller_id == NO_LEADER else status.controller_id
    brokers = [
        {"id": broker_id, "host": host, "port": port, "controller": broker_id == controller}
        for broker_id, host, port in status.brokers
    ]
    under_replicated = [_partition(health) for health in status.under_replicated]
    offline = [_partition(health) for health in status.offline]
    coordinators = [
        {"topic": topic.topic, "partitions": topic.partitions, "broker": broker, "leads": leads}
        for topic in status.coordinators
        for broker, leads in topic.led
    ]
    keys = [
        {
            "kind": key.kind,
            "key": key.key,
            "topic": key.topic,
            "partition": None if key.partition < 0 else key.partition,
            "coordinator": None if key.broker == NO_LEADER else key.broker,
        }
        for key in status.keys
    ]
    data = {
        "brokers": brokers,
        "controller": controller,
        "controller_epoch": status.controller_epoch,
        "under_replicated_partitions": under_replicated,
        "offline_partitions": offline,
        "coordinators": coordinators,
        "keys": keys,
    }
    broker_columns = (
        Column("id", "broker", justify="right"),
        Column("host", "host"),
        Column("port", "port", justify="right"),
        Column("controller", "controller"),
    )
    partition_columns = (
        Column("topic", "topic"),
        Column("partition", "partition", justify="right"),
        Column("leader", "leader", justify="right"),
        Column("replicas", "replicas"),
        Column("isr", "isr"),
    )
    coordinator_columns = (
        Column("topic", "internal topic"),
        Column("broker", "broker", justify="right"),
        Column("leads", "partitions led (coordinated)", justify="right"),
    )
    key_columns = (
        Column("kind", "kind"),
        Column("key", "key"),
        Column("topic", "internal topic"),
        Column("partition", "partition", justify="right"),
        Column("coordinator", "coordinator", justify="right"),
    )
    note = "controller: none" if controller is None else f"controller: broker {controller}"
    note += f" (controller epoch {status.controller_epoch})"
    tables = [
        Table(broker_columns, brokers, title="brokers", empty="no live broker"),
        Table(partition_columns, under_replicated, title="under-replicated partitions"),
        Table(partition_columns, offline, title="offline partitions"),
        Table(coordinator_columns, coordinators, title="coordinators", empty="no internal topic yet"),
    ]
    if keys:
        tables.append(Table(key_columns, keys, title="coordinators of"))
    return Report(data, tables, [note])


def _partition(health: PartitionHealth) -> dict[str, Any]:
    return {
        "topic": health.topic,
        "partition": health.partition,
        "leader": None if health.leader == NO_LEADER else health.leader,
        "replicas": list(health.replicas),
        "isr": list(health.isr),
    }
