"""What every API handler shares: the request context and small helpers."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from onceflow.broker.coordinator_shards import Shard
from onceflow.broker.core import Broker
from onceflow.coordinator.group import GroupCoordinator
from onceflow.coordinator.runtime import DurableLog, write_error
from onceflow.coordinator.transaction import TransactionCoordinator, TxnReply
from onceflow.protocol.build import build
from onceflow.protocol.codec import response_type
from onceflow.security.session import Session


class Ordered(NamedTuple):
    """A reply whose request must finish changing the broker's state (a Produce's appends)
    before the connection's next request is dispatched: a Produce validated off the event loop
    keeps the producer's order. Other connections are served meanwhile."""

    reply: Awaitable[Any]
    done_changing: Awaitable[None]


class VersionRange(NamedTuple):
    min: int
    max: int


@dataclass(slots=True)
class Stamps:
    """perf_counter() times of one request on its way through the broker, for the stage metrics."""

    received: float  # before the bytes that completed it were decoded
    durable: float | None = None  # when what it appended was fsynced


@dataclass(frozen=True, slots=True)
class Request:
    broker: Broker
    api_key: int
    api_version: int
    header: Any
    body: Any
    stamps: Stamps
    session: Session  # who sent it, from where, over which listener's authentication

    def respond(self, **values: Any) -> Any:
        """The response entity of this request's API and version."""
        return build(response_type(self.api_key, self.api_version), values)


# Kafka's AclOperation codes. Without an authorizer Kafka allows every operation that exists for
# a resource type (AclEntry.supportedOperations) and reports them as a bit field.
_READ, _WRITE, _CREATE, _DELETE, _ALTER, _DESCRIBE = 3, 4, 5, 6, 7, 8
_CLUSTER_ACTION, _DESCRIBE_CONFIGS, _ALTER_CONFIGS, _IDEMPOTENT_WRITE = 9, 10, 11, 12
TOPIC_OPERATIONS = sum(
    1 << code
    for code in (_READ, _WRITE, _CREATE, _DELETE, _ALTER, _DESCRIBE, _DESCRIBE_CONFIGS, _ALTER_CONFIGS)
)
CLUSTER_OPERATIONS = sum(
    1 << code
    for code in (
        _CREATE,
        _CLUSTER_ACTION,
        _DESCRIBE_CONFIGS,
        _ALTER_CONFIGS,
        _IDEMPOTENT_WRITE,
        _ALTER,
        _DESCRIBE,
    )
)
# What Kafka answers when the client did not ask for the operations.
OPERATIONS_NOT_REQUESTED = -(2**31)


def topic_name(
    request: Request, name: str | None, topic_id: uuid.UUID | None, first_version_with_ids: int
) -> str | None:
    """The topic a request names: by `name` before `first_version_with_ids`, else by its id
    (KIP-516), None when no topic has that id."""
    if request.api_version < first_version_with_ids or topic_id is None:
        return name
    broker = request.broker
    found = broker.logs.names_by_topic_id.get(topic_id)
    if found is None:  # a topic this broker holds no replica of
        found = broker.metadata.names_by_topic_id.get(topic_id)
    return found


def leader_endpoints(
    request: Request, partitions: Iterable[dict[str, Any]], errors: Collection[ErrorCode]
) -> list[dict[str, Any]]:
    """KIP-951: the endpoints of the current leaders named by partitions that answer one of
    `errors`, so that the client goes to the new leader without a Metadata request first."""
    leaders = {
        partition["current_leader"]["leader_id"]
        for partition in partitions
        if partition["error_code"] in errors and "current_leader" in partition
    }
    if not leaders:
        return []
    return [
        {"node_id": endpoint.node_id, "host": endpoint.host, "port": endpoint.port, "rack": None}
        for endpoint in request.broker.known_endpoints()
        if endpoint.node_id in leaders
    ]


def group_coordinator(request: Request, group_id: str) -> Shard[GroupCoordinator] | ErrorCode:
    """The coordinator of `group_id` on this broker, or the error to answer: NOT_COORDINATOR
    when another broker leads its partition of `__consumer_offsets` (the client looks the
    coordinator up again, as with Kafka), COORDINATOR_LOAD_IN_PROGRESS while this broker loads
    it. Served by a broker that does not lead it, a client would get a stale copy: members of
    one group split over two coordinators were each given every partition."""
    broker = request.broker
    return broker.coordinator(broker.groups, group_id)


def transaction_coordinator(
    request: Request, transactional_id: str
) -> Shard[TransactionCoordinator] | ErrorCode:
    """The coordinator of `transactional_id` on this broker, or the error to answer, as for
    groups (`group_coordinator`)."""
    broker = request.broker
    return broker.coordinator(broker.transactions, transactional_id)


def once_settled(
    request: Request,
    shard: Shard[TransactionCoordinator],
    reply: TxnReply[Any],
    answer: Any,
    refused: Callable[[ErrorCode], Any],
) -> Awaitable[Any]:
    """The answer to a transaction coordinator's `reply`, once the broker did what the reply
    asks (started phase two now, waited for its writes to be committed and, for EndTxn, for
    phase two); `refused(code)` when it could not (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE:
    the client retries)."""
    return _after(request.broker.settle(shard, reply), answer, refused)


async def once_committed(
    request: Request,
    logs: Iterable[DurableLog],
    timeout_s: float,
    answer: Any,
    refused: Callable[[ErrorCode], Any],
) -> Any:
    """The answer once everything written to `logs` so far is committed (`Broker.wait_committed`),
    `refused(code)` when it was not."""
    code = await request.broker.wait_committed(logs, timeout_s)
    return answer if code == ErrorCode.none else refused(write_error(code))


async def _after(settled: Awaitable[ErrorCode], answer: Any, refused: Callable[[ErrorCode], Any]) -> Any:
    code = await settled
    return answer if code == ErrorCode.none else refused(code)


def for_version(code: ErrorCode, version: int, first_version_with_producer_fenced: int) -> ErrorCode:
    """KIP-588: older request versions report a fenced producer as INVALID_PRODUCER_EPOCH."""
    if code == ErrorCode.producer_fenced and version < first_version_with_producer_fenced:
        return ErrorCode.invalid_producer_epoch
    return code
