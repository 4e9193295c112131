"""CreateTopics (19)."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.broker.described_configs import topic_entries
from onceflow.cluster.controller import ReplicationFactorError, assign_replicas
from onceflow.cluster.errors import ClusterError, TopicExistsError
from onceflow.log.config import LogConfig
from onceflow.log.errors import LogError
from onceflow.log.manager import NewPartitions, topic_collision

API_KEY = 19
MIN_VERSION = 2
MAX_VERSION = 7
_NOT_POSITIVE = "must be at least 1 (or -1 for the default)"


def handle(request: Request) -> Any:
    body = request.body
    if request.broker.cluster is not None:
        return _create_in_cluster(request)
    answers = [_plan(request, topic, body.validate_only) for topic in body.topics]
    if any(isinstance(answer, NewPartitions) for answer in answers):
        return _make_then_answer(request, answers)
    return request.respond(throttle_time=0, topics=answers)


async def _make_then_answer(request: Request, answers: list[dict[str, Any] | NewPartitions]) -> Any:
    """The partitions are made on disk off the event loop (thousands take seconds), then added."""
    logs = request.broker.logs
    topics = []
    for answer in answers:
        if isinstance(answer, NewPartitions):
            try:
                await request.broker.run_disk_work(logs.make, answer)
                info = logs.add(answer)
            except LogError as error:
                answer = _failed(answer.info.name, error.error_code, str(error))
            else:
                config = answer.config
                answer = _created(request, info.name, info.topic_id, info.partitions, 1, info.configs, config)
        topics.append(answer)
    return request.respond(throttle_time=0, topics=topics)


async def _create_in_cluster(request: Request) -> Any:
    """Write each topic's assignment to ZooKeeper, then answer once the controller elected
    its leaders (or the request's timeout passed, as Kafka answers REQUEST_TIMED_OUT)."""
    body = request.body
    cluster = request.broker.cluster
    assert cluster is not None
    results = []
    for topic in body.topics:
        result, replicas, configs = _plan_in_cluster(request, topic)
        if replicas and not body.validate_only:
            try:
                result["topic_id"] = await cluster.create_topic(topic.name, replicas, configs)
            except TopicExistsError as error:
                result = _failed(topic.name, ErrorCode.topic_already_exists, str(error))
            except ClusterError as error:
                result = _failed(topic.name, ErrorCode.request_timed_out, str(error))
            else:
                if not await cluster.wait_for_leaders(topic.name, body.timeout.total_seconds()):
                    result = _failed(
                        topic.name,
                        ErrorCode.request_timed_out,
                        "the topic is created but its leaders are not elected yet",
                    )
        results.append(result)
    return request.respond(throttle_time=0, topics=results)


def _plan_in_cluster(
    request: Request, topic: Any
) -> tuple[dict[str, Any], tuple[tuple[int, ...], ...], dict[str, str]]:
    """The answer if all goes well, the replicas of each partition (none when it cannot be
    created) and the topic's configs."""
    broker = request.broker
    assert broker.cluster is not None
    view = broker.cluster.view
    name = topic.name
    configs = {config.name: config.value for config in topic.configs if config.value is not None}
    if name in view.topics:
        return _failed(name, ErrorCode.topic_already_exists, f"topic {name!r} already exists"), (), configs
    collision = topic_collision(name, view.topics)
    if collision is not None:
        return _failed(name, ErrorCode.invalid_topic_exception, collision), (), configs
    if topic.assignments and (topic.num_partitions != -1 or topic.replication_factor != -1):
        message = "give either assignments or num_partitions and replication_factor"
        return _failed(name, ErrorCode.invalid_request, message), (), configs
    partitions = len(topic.assignments) or topic.num_partitions
    if partitions == -1:
        partitions = broker.config.get_int("num.partitions")
    factor = topic.replication_factor
    if factor == -1:
        factor = broker.config.get_int("default.replication.factor")
    try:
        effective = broker.logs.validate_new_topic(name, partitions, configs)
        if not topic.assignments:
            replicas = assign_replicas(name, partitions, factor, view.brokers)
    except LogError as error:
        return _failed(name, error.error_code, str(error)), (), configs
    except ReplicationFactorError as error:
        return _failed(name, ErrorCode.invalid_replication_factor, str(error)), (), configs
    if topic.assignments:
        replicas = tuple(tuple(assignment.broker_ids) for assignment in topic.assignments)
        unknown = {node for nodes in replicas for node in nodes} - set(view.brokers)
        if unknown or any(not nodes or len(set(nodes)) != len(nodes) for nodes in replicas):
            message = f"assignments must name distinct live brokers (unknown: {sorted(unknown)})"
            return _failed(name, ErrorCode.invalid_replica_assignment, message), (), configs
    result = _created(request, name, None, partitions, len(replicas[0]), configs, effective)
    return result, replicas, configs


def _plan(request: Request, topic: Any, validate_only: bool) -> dict[str, Any] | NewPartitions:
    """The answer, or the partitions to make before answering."""
    broker = request.broker
    name = topic.name
    partitions = topic.num_partitions
    if topic.assignments:
        if partitions != -1:
            return _failed(name, ErrorCode.invalid_request, "give either num_partitions or assignments")
        partitions = len(topic.assignments)
    if partitions == -1:
        partitions = broker.config.get_int("num.partitions")
    if topic.replication_factor not in (-1, 1):
        problem = "is larger than the 1 available broker" if topic.replication_factor > 1 else _NOT_POSITIVE
        message = f"replication factor {topic.replication_factor} {problem}"
        return _failed(name, ErrorCode.invalid_replication_factor, message)
    configs = {config.name: config.value for config in topic.configs if config.value is not None}
    if name in broker.logs.topics:
        return _failed(name, ErrorCode.topic_already_exists, f"topic {name!r} already exists")
    try:
        if not validate_only:
            return broker.logs.plan_topic(name, partitions, configs)
        effective = broker.logs.validate_new_topic(name, partitions, configs)
    except LogError as error:
        return _failed(name, error.error_code, str(error))
    return _created(request, name, None, partitions, 1, configs, effective)


def _created(
    request: Request,
    name: str,
    topic_id: uuid.UUID | None,
    partitions: int,
    replication_factor: int,
    configs: dict[str, str],
    effective: LogConfig,
) -> dict[str, Any]:
    return {
        "name": name,
        "topic_id": topic_id,
        "error_code": ErrorCode.none,
        "error_message": None,
        "num_partitions": partitions,
        "replication_factor": replication_factor,
        # v5+: the new topic's configs, as DescribeConfigs would report them.
        "configs": [
            {
                "name": entry.name,
                "value": entry.value,
                "read_only": False,
                "config_source": entry.source,
                "is_sensitive": False,
            }
            for entry in topic_entries(request.broker.config, configs, effective)
        ],
    }


def _failed(name: str, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"name": name, "topic_id": None, "error_code": code, "error_message": message, "configs": []}
