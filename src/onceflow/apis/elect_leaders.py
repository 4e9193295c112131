"""ElectLeaders (43): preferred (v0+) or unclean (v1+) leader election, done by the controller.

A preferred election moves each partition's leadership to its first assigned replica, if that
one is live and in the ISR; an unclean one gives a partition without a live leader one, from the
ISR if a member is live, else the first live replica (which may lose acknowledged records). Each
is a compare-and-set on the partition's state znode, as the controller's own writes, and the
answer waits (up to the request's timeout) until this broker's view shows the new leaders. Only
the controller elects: another broker answers NOT_CONTROLLER, and the client asks the controller
named in Metadata. With no partitions named, every partition is elected and those that needed no
election are left out of the answer, as Kafka's controller answers. A single broker leads every
partition already: ELECTION_NOT_NEEDED.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import Request
from onceflow.cluster.controller import Election, ElectionRefused
from onceflow.cluster.errors import ClusterError

API_KEY = 43
MIN_VERSION = 0
MAX_VERSION = 2

_REFUSALS = {
    ElectionRefused.UNKNOWN_PARTITION: (ErrorCode.unknown_topic_or_partition, "no such partition"),
    ElectionRefused.NOT_NEEDED: (ErrorCode.election_not_needed, "the leader is already the one asked for"),
    ElectionRefused.PREFERRED_NOT_AVAILABLE: (
        ErrorCode.preferred_leader_not_available,
        "the preferred replica is not live or not in the ISR",
    ),
    ElectionRefused.NO_ELIGIBLE_LEADER: (ErrorCode.eligible_leaders_not_available, "no replica is live"),
}


def handle(request: Request) -> Any:
    body = request.body
    wanted = (
        None
        if body.topic_partitions is None
        else [(topic.topic, partition) for topic in body.topic_partitions for partition in topic.partitions]
    )
    try:
        election = Election(getattr(body, "election_type", Election.PREFERRED))
    except ValueError:
        return _answer(request, ErrorCode.invalid_request, {})
    cluster = request.broker.cluster
    if cluster is None:
        return _answer(request, ErrorCode.none, _single_broker(request, wanted))
    return _elect(request, wanted, election)


async def _elect(request: Request, wanted: list[tuple[str, int]] | None, election: Election) -> Any:
    cluster = request.broker.cluster
    assert cluster is not None
    try:
        outcomes = await cluster.elect_leaders(wanted, election, request.body.timeout.total_seconds())
    except ClusterError as error:
        every = dict.fromkeys(wanted or [], (ErrorCode.unknown_server_error, str(error)))
        return _answer(request, ErrorCode.none if wanted else ErrorCode.unknown_server_error, every)
    if outcomes is None:
        return _answer(request, ErrorCode.not_controller, dict.fromkeys(wanted or [], _NOT_CONTROLLER))
    results = {
        key: (ErrorCode.none, None) if isinstance(outcome, int) else _REFUSALS[outcome]
        for key, outcome in outcomes.items()
        if wanted is not None or outcome is not ElectionRefused.NOT_NEEDED
    }
    return _answer(request, ErrorCode.none, results)


_NOT_CONTROLLER = (ErrorCode.not_controller, "this broker is not the controller")


def _single_broker(
    request: Request, wanted: list[tuple[str, int]] | None
) -> dict[tuple[str, int], tuple[ErrorCode, str | None]]:
    if wanted is None:
        return {}  # every partition is led by this broker: none needed an election
    return {
        key: _REFUSALS[
            ElectionRefused.NOT_NEEDED
            if request.broker.logs.get(*key) is not None
            else ElectionRefused.UNKNOWN_PARTITION
        ]
        for key in wanted
    }


def _answer(
    request: Request, error: ErrorCode, results: Mapping[tuple[str, int], tuple[ErrorCode, str | None]]
) -> Any:
    """v0 has no top-level error: each partition carries it."""
    if request.api_version == 0 and error != ErrorCode.none:
        results = {key: (error, message) for key, (_, message) in results.items()}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), (code, message) in sorted(results.items()):
        by_topic.setdefault(topic, []).append(
            {"partition_id": partition, "error_code": code, "error_message": message}
        )
    return request.respond(
        throttle_time=0,
        error_code=error,
        replica_election_results=[
            {"topic": topic, "partition_result": partitions} for topic, partitions in by_topic.items()
        ],
    )
