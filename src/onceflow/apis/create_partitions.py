"""CreatePartitions (37): grow a topic's partition count. In a cluster the new partitions go
into the topic's assignment znode, and the answer waits for the controller to elect their
leaders."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.cluster.controller import ReplicationFactorError, assign_replicas
from onceflow.cluster.errors import AssignmentChangedError, ClusterError, PartitionCountError
from onceflow.cluster.znodes import TopicAssignment
from onceflow.coordinator.runtime import is_internal
from onceflow.log.errors import LogError
from onceflow.log.manager import NewPartitions

API_KEY = 37
MIN_VERSION = 0
MAX_VERSION = 3


def handle(request: Request) -> Any:
    if request.broker.cluster is not None:
        return _create_in_cluster(request)
    body = request.body
    logs = request.broker.logs
    results = []
    plans: list[NewPartitions] = []
    for topic in body.topics:
        if is_internal(topic.name):
            results.append(_internal(topic.name))
            continue
        try:
            if body.validate_only:
                logs.validate_new_partition_count(topic.name, topic.count)
            else:
                plans.append(logs.plan_partitions(topic.name, topic.count))
        except LogError as error:
            results.append(_failed(topic.name, error.error_code, str(error)))
            continue
        results.append({"name": topic.name, "error_code": ErrorCode.none})
    if plans:
        return _make_then_answer(request, plans, results)
    return request.respond(throttle_time=0, results=results)


async def _make_then_answer(
    request: Request, plans: list[NewPartitions], results: list[dict[str, Any]]
) -> Any:
    """The partitions are made on disk off the event loop (thousands take seconds), then added."""
    logs = request.broker.logs
    for plan in plans:
        try:
            await request.broker.run_disk_work(logs.make, plan)
            logs.add(plan)
        except LogError as error:
            failed = _failed(plan.info.name, error.error_code, str(error))
            results[:] = [failed if result["name"] == plan.info.name else result for result in results]
    return request.respond(throttle_time=0, results=results)


async def _create_in_cluster(request: Request) -> Any:
    body = request.body
    cluster = request.broker.cluster
    assert cluster is not None
    results = []
    for topic in body.topics:
        planned = _internal(topic.name) if is_internal(topic.name) else _plan(request, topic)
        if not isinstance(planned, TopicAssignment):
            results.append(planned)
            continue
        if not body.validate_only:
            try:
                await cluster.add_partitions(topic.name, planned)
            except PartitionCountError as error:
                results.append(_failed(topic.name, ErrorCode.invalid_partitions, str(error)))
                continue
            except AssignmentChangedError as error:
                results.append(_failed(topic.name, ErrorCode.reassignment_in_progress, str(error)))
                continue
            except ClusterError as error:
                results.append(_failed(topic.name, ErrorCode.unknown_server_error, str(error)))
                continue
            if not await cluster.wait_for_leaders(topic.name, body.timeout.total_seconds(), topic.count):
                message = "the partitions are created but their leaders are not elected yet"
                results.append(_failed(topic.name, ErrorCode.request_timed_out, message))
                continue
        results.append({"name": topic.name, "error_code": ErrorCode.none})
    return request.respond(throttle_time=0, results=results)


def _plan(request: Request, topic: Any) -> TopicAssignment | dict[str, Any]:
    """The topic's assignment with its new partitions, or the answer that refuses them. As
    Kafka: the new partitions get the topic's replication factor, or the assignments given."""
    broker = request.broker
    assert broker.cluster is not None
    view = broker.cluster.view
    name = topic.name
    current = view.topics.get(name)
    if current is None or name in view.topics_to_delete:
        return _failed(name, ErrorCode.unknown_topic_or_partition, f"unknown topic '{name}'")
    have = len(current.replicas)
    if topic.count <= have:
        message = (
            f"topic '{name}' has {have} partitions; the count can only grow, so {topic.count} is not allowed"
        )
        return _failed(name, ErrorCode.invalid_partitions, message)
    if topic.assignments:
        added = tuple(tuple(assignment.broker_ids) for assignment in topic.assignments)
        unknown = {node for nodes in added for node in nodes} - set(view.brokers)
        if (
            len(added) != topic.count - have
            or unknown
            or any(len(set(nodes)) != len(nodes) for nodes in added)
        ):
            message = (
                f"give {topic.count - have} assignments of distinct live brokers (unknown: {sorted(unknown)})"
            )
            return _failed(name, ErrorCode.invalid_replica_assignment, message)
    else:
        try:
            added = assign_replicas(name, topic.count, len(current.replicas[0]), view.brokers)[have:]
        except ReplicationFactorError as error:
            return _failed(name, ErrorCode.invalid_replication_factor, str(error))
    return TopicAssignment(current.topic_id, current.replicas + added)


def _internal(name: str) -> dict[str, Any]:
    """The coordinators' topics keep their partition count: a key's partition, and the state of
    its group or transactional id, would move (Kafka's tools refuse it too, KAFKA-7801)."""
    return _failed(name, ErrorCode.policy_violation, f"the partition count of {name} cannot change")


def _failed(name: str, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"name": name, "error_code": code, "error_message": message}
