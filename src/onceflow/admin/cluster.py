"""`onceflow cluster status`: a cluster's brokers, controller, and under-replicated and offline
partitions, read from its ZooKeeper (where Kafka's own tools of the ZooKeeper era looked too).
`onceflow cluster run`: a local cluster in the foreground (`cluster.launcher`)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from onceflow.admin.errors import AdminError
from onceflow.admin.render import Column, Report, Table
from onceflow.cluster.errors import ClusterError
from onceflow.cluster.status import ClusterStatus, PartitionHealth, cluster_status
from onceflow.cluster.znodes import NO_LEADER
from onceflow.extras import MissingExtraError, require


def register(commands: argparse._SubParsersAction[Any]) -> None:
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
    run.set_defaults(foreground=run_cluster_command)


def run_cluster_command(args: argparse.Namespace) -> int:
    """Runs until SIGTERM or Ctrl-C; errors are one line on stderr (exit 2: bad input)."""
    from onceflow.cluster.launcher import LaunchError, run_cluster

    try:
        require("onceflow cluster run", "kazoo", "cluster", ("kazoo",))
        return run_cluster(args.brokers, args.data_dir, lambda line: print(line, flush=True))
    except (LaunchError, MissingExtraError) as error:
        print(f"onceflow cluster run: {error}", file=sys.stderr)
        return error.exit_code if isinstance(error, LaunchError) else 1


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
