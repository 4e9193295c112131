"""DescribeCluster (60, KIP-700): the cluster id, the controller and the brokers, which admin
clients ask instead of Metadata; v1 adds the endpoint type (KIP-919), v2 fenced brokers."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.apis.common import CLUSTER_OPERATIONS, OPERATIONS_NOT_REQUESTED, Request

API_KEY = 60
MIN_VERSION = 0
MAX_VERSION = 2

BROKERS = 1
CONTROLLERS = 2


def handle(request: Request) -> Any:
    broker = request.broker
    body = request.body
    endpoint_type = getattr(body, "endpoint_type", BROKERS)
    if endpoint_type != BROKERS:
        # As a Kafka broker: controllers are asked about controllers, and there are none here.
        code = (
            ErrorCode.mismatched_endpoint_type
            if endpoint_type == CONTROLLERS
            else ErrorCode.unsupported_endpoint_type
        )
        return request.respond(
            throttle_time=0,
            error_code=code,
            error_message=f"this broker does not answer for endpoint type {endpoint_type}",
            endpoint_type=endpoint_type,
            cluster_id=broker.cluster_id,
            controller_id=-1,
            brokers=[],
        )
    # Kafka names a live broker as controller, since clients cannot reach KRaft controllers: in a
    # cluster the one holding /controller, a single broker itself.
    view = broker.metadata
    controller_id = view.controller_id
    nodes = [(node.broker_id, node.host, node.port) for node in view.brokers.values()]
    return request.respond(
        throttle_time=0,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=BROKERS,
        cluster_id=broker.cluster_id,
        controller_id=controller_id,
        brokers=[
            {"broker_id": node_id, "host": host, "port": port, "rack": None, "is_fenced": False}
            for node_id, host, port in sorted(nodes)
        ],
        cluster_authorized_operations=(
            CLUSTER_OPERATIONS if body.include_cluster_authorized_operations else OPERATIONS_NOT_REQUESTED
        ),
    )
