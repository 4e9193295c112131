"""Clients are told of brokers at the addresses of the listener they came in on, as Kafka tells
them: a client on a SASL_SSL listener is never sent to a PLAINTEXT port. Handlers name brokers by
the inter-broker listener's addresses (the broker's own `endpoint`, each registration's host and
port); on a broker with several listeners, an answer to another listener's client is changed
here: Metadata's and DescribeCluster's brokers, FindCoordinator's coordinators, Produce's and
Fetch's node endpoints (KIP-951)."""

from __future__ import annotations

import dataclasses
from typing import Any

from onceflow.apis.common import Request

# The answers that name brokers: API key -> the field holding them, and its node id field.
_BROKER_LISTS = {3: ("brokers", "node_id"), 60: ("brokers", "broker_id"), 0: ("node_endpoints", "node_id"),
                 1: ("node_endpoints", "node_id"), 10: ("coordinators", "node_id")}  # fmt: skip


def names_brokers(api_key: int) -> bool:
    return api_key in _BROKER_LISTS


def for_listener(request: Request, answer: Any) -> Any:
    """`answer` with every broker named at its address on the request's listener."""
    addresses = _addresses(request)
    field, id_field = _BROKER_LISTS[request.api_key]
    if request.api_key == 10 and not hasattr(answer, field):  # FindCoordinator v0-3: one, at the top
        return _moved(answer, "node_id", addresses)
    entries = getattr(answer, field, None)
    if not entries:
        return answer
    moved = tuple(_moved(entry, id_field, addresses) for entry in entries)
    return dataclasses.replace(answer, **{field: moved})


def _moved(entry: Any, id_field: str, addresses: dict[int, tuple[str, int]]) -> Any:
    address = addresses.get(int(getattr(entry, id_field)))
    if address is None:
        return entry
    return dataclasses.replace(entry, host=address[0], port=type(entry.port)(address[1]))


def _addresses(request: Request) -> dict[int, tuple[str, int]]:
    broker, listener = request.broker, request.session.listener
    if broker.cluster is None:
        own = broker.listener_endpoints.get(listener)
        return {} if own is None else {broker.node_id: own}
    return {
        node: registration.endpoints[listener]
        for node, registration in broker.cluster.view.brokers.items()
        if listener in registration.endpoints
    }
