"""The idempotence rules of docs/design.md#sequence-and-epoch-rules, one raw Produce request at a time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from tests.wire import WireClient, make_batch, produce

TOPIC = "idem"


@pytest.fixture
def client(broker: EmbeddedBroker) -> Iterator[WireClient]:
    with WireClient(broker.bootstrap_servers) as wire:
        assert wire.create_topic(TOPIC, 1) == ErrorCode.none
        yield wire


def _producer_id(client: WireClient) -> int:
    response = client.init_producer_id()
    assert response.error_code == ErrorCode.none and response.producer_epoch == 0
    return int(response.producer_id)


def _send(
    client: WireClient, pid: int, epoch: int, seq: int, count: int = 2, tag: str = "v"
) -> tuple[ErrorCode, int]:
    batch = make_batch([f"{tag}-{seq + i}".encode() for i in range(count)], pid, epoch, seq)
    response = produce(client, TOPIC, 0, batch)
    return response.error_code, response.base_offset


def _log_end(client: WireClient) -> int:
    return client.list_offset(TOPIC, 0)


def test_producer_ids_are_fresh_and_start_at_epoch_zero(client: WireClient) -> None:
    assert _producer_id(client) != _producer_id(client)


def test_empty_transactional_id_is_invalid_request(client: WireClient) -> None:
    response = client.init_producer_id(transactional_id="")
    assert response.error_code == ErrorCode.invalid_request


def test_duplicate_gets_the_original_offset_and_is_not_stored(client: WireClient) -> None:
    pid = _producer_id(client)
    assert _send(client, pid, 0, 0) == (ErrorCode.none, 0)
    assert _send(client, pid, 0, 2) == (ErrorCode.none, 2)
    assert _send(client, pid, 0, 0) == (ErrorCode.none, 0)  # retry of the first batch
    assert _send(client, pid, 0, 2) == (ErrorCode.none, 2)
    assert _log_end(client) == 4


def test_only_the_last_five_batches_are_remembered(client: WireClient) -> None:
    pid = _producer_id(client)
    for batch in range(6):
        assert _send(client, pid, 0, batch * 2)[0] == ErrorCode.none
    assert _send(client, pid, 0, 2) == (ErrorCode.none, 2)  # second batch: still in the window
    code, _ = _send(client, pid, 0, 0)  # first batch fell out of the window
    assert code == ErrorCode.out_of_order_sequence_number
    assert _log_end(client) == 12


def test_a_sequence_gap_is_out_of_order(client: WireClient) -> None:
    pid = _producer_id(client)
    assert _send(client, pid, 0, 0)[0] == ErrorCode.none
    assert _send(client, pid, 0, 5)[0] == ErrorCode.out_of_order_sequence_number
    assert _send(client, pid, 0, 1, count=1)[0] == ErrorCode.out_of_order_sequence_number  # overlaps
    assert _log_end(client) == 2


def test_a_partial_overlap_is_not_a_duplicate(client: WireClient) -> None:
    pid = _producer_id(client)
    assert _send(client, pid, 0, 0, count=4)[0] == ErrorCode.none
    assert _send(client, pid, 0, 0, count=2)[0] == ErrorCode.out_of_order_sequence_number


def test_a_new_epoch_must_start_at_sequence_zero(client: WireClient) -> None:
    pid = _producer_id(client)
    assert _send(client, pid, 0, 0)[0] == ErrorCode.none
    assert _send(client, pid, 1, 2)[0] == ErrorCode.out_of_order_sequence_number
    assert _send(client, pid, 1, 0)[0] == ErrorCode.none  # KIP-360 style bump: seq restarts
    assert _send(client, pid, 0, 2)[0] == ErrorCode.invalid_producer_epoch  # the old epoch is fenced
    assert _log_end(client) == 4


def test_sequences_wrap_after_int32_max(client: WireClient) -> None:
    pid = _producer_id(client)
    top = 2**31 - 1
    # Unknown producers may start anywhere; the wrap is what is checked here.
    assert _send(client, pid, 0, top - 1, count=2)[0] == ErrorCode.none
    assert _send(client, pid, 0, 0, count=2)[0] == ErrorCode.none
    assert _send(client, pid, 0, 5)[0] == ErrorCode.out_of_order_sequence_number


def test_batches_without_producer_id_are_never_deduplicated(client: WireClient) -> None:
    batch = make_batch([b"plain"])
    assert produce(client, TOPIC, 0, batch).base_offset == 0
    assert produce(client, TOPIC, 0, batch).base_offset == 1
