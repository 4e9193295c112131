"""Raw transactional requests: exact error codes per version, the zombie check on Produce, and
the LSO seen through ListOffsets and Fetch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from tests.wire import WireClient, make_batch, produce

TOPIC = "wire-txn"
MAX_TIMESTAMP = -3


@pytest.fixture
def client(broker: EmbeddedBroker) -> Iterator[WireClient]:
    with WireClient(broker.bootstrap_servers) as wire:
        assert wire.create_topic(TOPIC, 2) == ErrorCode.none
        yield wire


def _add_partitions(client: WireClient, tid: str, pid: int, epoch: int, version: int = 3) -> ErrorCode:
    response = client.request(
        24,
        version,
        v3_and_below_transactional_id=tid,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[{"name": TOPIC, "partitions": [0]}],
    )
    return ErrorCode(response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)


def _end(client: WireClient, tid: str, pid: int, epoch: int, commit: bool, version: int = 3) -> ErrorCode:
    response = client.request(
        26, version, transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit
    )
    return ErrorCode(response.error_code)


def _txn_batch(pid: int, epoch: int, sequence: int, value: bytes) -> bytes:
    return make_batch([value], pid, epoch, sequence, transactional=True)


def test_error_codes_for_wrong_ids_and_epochs_by_version(client: WireClient) -> None:
    session = client.init_producer_id("w")
    pid = session.producer_id
    assert _add_partitions(client, "nobody", pid, 0) == ErrorCode.invalid_producer_id_mapping
    assert _add_partitions(client, "w", pid + 1, 0) == ErrorCode.invalid_producer_id_mapping
    assert _add_partitions(client, "w", pid, 1, version=3) == ErrorCode.producer_fenced
    assert (
        _add_partitions(client, "w", pid, 1, version=1) == ErrorCode.invalid_producer_epoch
    )  # before KIP-588
    assert _end(client, "w", pid, 0, commit=True) == ErrorCode.invalid_txn_state  # nothing is open
    assert _add_partitions(client, "w", pid, 0) == ErrorCode.none
    assert _end(client, "w", pid, 5, commit=True, version=0) == ErrorCode.invalid_producer_epoch
    assert _end(client, "w", pid, 0, commit=True) == ErrorCode.none  # the state stayed consistent
    assert _end(client, "w", pid, 0, commit=True) == ErrorCode.none  # a retry
    assert _end(client, "w", pid, 0, commit=False) == ErrorCode.invalid_txn_state
    too_long = client.request(
        22, 4, transactional_id="w", transaction_timeout=900_001, producer_id=-1, producer_epoch=-1
    )
    assert too_long.error_code == ErrorCode.invalid_transaction_timeout


def test_transactional_batches_outside_the_open_transaction_are_refused(client: WireClient) -> None:
    pid = client.init_producer_id("z").producer_id
    # Kafka refuses transactional records without the request's transactional id too.
    nameless = produce(client, TOPIC, 0, _txn_batch(pid, 0, 0, b"nameless"))
    assert nameless.error_code == ErrorCode.invalid_txn_state
    assert (
        produce(client, TOPIC, 0, _txn_batch(pid, 0, 0, b"no txn yet"), transactional_id="z").error_code
        == ErrorCode.invalid_txn_state
    )
    assert _add_partitions(client, "z", pid, 0) == ErrorCode.none
    assert (
        produce(client, TOPIC, 1, _txn_batch(pid, 0, 0, b"not added"), transactional_id="z").error_code
        == ErrorCode.invalid_txn_state
    )
    assert (
        produce(client, TOPIC, 0, _txn_batch(pid, 0, 0, b"inside"), transactional_id="z").error_code
        == ErrorCode.none
    )
    assert _end(client, "z", pid, 0, commit=True) == ErrorCode.none
    # A zombie's late retry after the commit: the partition is no longer in a transaction.
    late = produce(client, TOPIC, 0, _txn_batch(pid, 0, 1, b"late"), transactional_id="z")
    assert late.error_code == ErrorCode.invalid_txn_state
    fenced = client.init_producer_id("z")  # a new session bumps the epoch
    assert fenced.producer_epoch == 1
    stale = produce(client, TOPIC, 0, _txn_batch(pid, 0, 1, b"stale"), transactional_id="z")
    assert stale.error_code == ErrorCode.invalid_producer_epoch


def test_the_lso_holds_read_committed_back_until_the_marker(client: WireClient) -> None:
    assert produce(client, TOPIC, 0, make_batch([b"plain"])).base_offset == 0
    pid = client.init_producer_id("lso").producer_id
    assert _add_partitions(client, "lso", pid, 0) == ErrorCode.none
    assert (
        produce(client, TOPIC, 0, _txn_batch(pid, 0, 0, b"pending"), transactional_id="lso").base_offset == 1
    )
    assert client.list_offset(TOPIC, 0, isolation_level=1) == 1
    assert client.list_offset(TOPIC, 0, isolation_level=0) == 2
    # By timestamp too, read_committed finds nothing past the LSO (Kafka's last fetchable offset).
    assert client.list_offset(TOPIC, 0, timestamp=0, isolation_level=1) == 0
    assert client.list_offset(TOPIC, 0, timestamp=MAX_TIMESTAMP, isolation_level=1) in (-1, 0)
    pending_at = (
        client.request(
            2,
            7,
            replica_id=-1,
            isolation_level=1,
            topics=[{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": _newest_ms(client)}]}],
        )
        .topics[0]
        .partitions[0]
    )
    # None, or the plain record when both were stamped in the same millisecond: never the pending one.
    assert pending_at.offset in (-1, 0)
    fetched = client.fetch({TOPIC: [0]}, isolation_level=1)
    partition = fetched.responses[0].partitions[0]
    assert (partition.high_watermark, partition.last_stable_offset) == (2, 1)
    assert _end(client, "lso", pid, 0, commit=False) == ErrorCode.none
    assert client.list_offset(TOPIC, 0, isolation_level=1) == 3  # past the ABORT marker
    fetched = client.fetch({TOPIC: [0]}, isolation_level=1)
    aborted = fetched.responses[0].partitions[0].aborted_transactions
    assert [(entry.producer_id, entry.first_offset) for entry in aborted] == [(pid, 1)]


def _newest_ms(client: WireClient) -> int:
    """The timestamp of the partition's newest record, as read_uncommitted ListOffsets says."""
    response = client.request(
        2,
        7,
        replica_id=-1,
        isolation_level=0,
        topics=[{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": MAX_TIMESTAMP}]}],
    )
    return int(response.topics[0].partitions[0].timestamp)


def _markers(client: WireClient, topic: str, pid: int, epoch: int, commit: bool) -> ErrorCode:
    response = client.request(
        27,
        1,
        markers=[
            {
                "producer_id": pid,
                "producer_epoch": epoch,
                "transaction_result": commit,
                "topics": [{"name": topic, "partition_indexes": [0]}],
                "coordinator_epoch": 0,
            }
        ],
    )
    return ErrorCode(response.markers[0].topics[0].partitions[0].error_code)


def test_write_txn_markers_ends_the_open_transaction_on_its_partitions(client: WireClient) -> None:
    """What a coordinator in a cluster sends a partition's leader."""
    pid = client.init_producer_id("marked").producer_id
    assert _add_partitions(client, "marked", pid, 0) == ErrorCode.none
    pending = produce(client, TOPIC, 0, _txn_batch(pid, 0, 0, b"pending"), transactional_id="marked")
    assert pending.base_offset == 0
    assert client.list_offset(TOPIC, 0, isolation_level=1) == 0
    assert _markers(client, TOPIC, pid, 0, commit=True) == ErrorCode.none
    assert client.list_offset(TOPIC, 0, isolation_level=1) == 2  # past the COMMIT marker
    # Not on a topic that does not exist, nor on a coordinator's own log.
    for elsewhere in ("missing", "__transaction_state"):
        assert _markers(client, elsewhere, pid, 0, commit=True) == ErrorCode.unknown_topic_or_partition


def _batched_add(client: WireClient, version: int, *transactions: dict[str, object]) -> dict[str, ErrorCode]:
    """AddPartitionsToTxn v4+: each transaction's error for partition 0 of TOPIC, by id."""
    response = client.request(
        24,
        version,
        transactions=[{"topics": [{"name": TOPIC, "partitions": [0]}], **txn} for txn in transactions],
    )
    assert response.error_code == ErrorCode.none
    return {
        str(result.transactional_id): ErrorCode(
            result.topic_results[0].results_by_partition[0].partition_error_code
        )
        for result in response.results_by_transaction
    }


@pytest.mark.parametrize("version", [4, 5])
def test_the_batched_form_adds_or_only_verifies_each_transaction(client: WireClient, version: int) -> None:
    """KIP-890's broker-side form, which Kafka 4.x serves: verify_only asks, and writes nothing."""
    first, second = (client.init_producer_id(name) for name in (f"a{version}", f"b{version}"))

    def txn(name: str, session: Any, verify_only: bool, epoch: int | None = None) -> dict[str, object]:
        return {
            "transactional_id": name,
            "producer_id": session.producer_id,
            "producer_epoch": session.producer_epoch if epoch is None else epoch,
            "verify_only": verify_only,
        }

    a, b = f"a{version}", f"b{version}"
    # Not yet in a transaction: verification says so (TRANSACTION_ABORTABLE) and adds nothing.
    assert _batched_add(client, version, txn(a, first, True)) == {a: ErrorCode.transaction_abortable}
    assert _batched_add(client, version, txn(a, first, True)) == {a: ErrorCode.transaction_abortable}
    # One request adds a's partition and checks b's stale epoch.
    assert _batched_add(client, version, txn(a, first, False), txn(b, second, True, epoch=7)) == {
        a: ErrorCode.none,
        b: ErrorCode.producer_fenced,
    }
    assert _batched_add(client, version, txn(a, first, True)) == {a: ErrorCode.none}
    # The partition really joined a's transaction: its transactional batch is taken.
    batch = _txn_batch(first.producer_id, first.producer_epoch, 0, b"in a")
    assert produce(client, TOPIC, 0, batch, transactional_id=a).error_code == ErrorCode.none
    ended = client.request(
        26,
        5,
        transactional_id=a,
        producer_id=first.producer_id,
        producer_epoch=first.producer_epoch,
        committed=True,
    )
    assert (ended.error_code, ended.producer_id, ended.producer_epoch) == (
        ErrorCode.none,
        first.producer_id,
        first.producer_epoch,  # transaction version 1: the epoch stays
    )
    refused = client.request(
        26, 5, transactional_id=a, producer_id=first.producer_id, producer_epoch=99, committed=True
    )
    assert (refused.error_code, refused.producer_id, refused.producer_epoch) == (
        ErrorCode.producer_fenced,
        -1,
        -1,
    )


def test_list_transactions_v2_filters_by_a_pattern_of_the_whole_id(client: WireClient) -> None:
    for name in ("orders-1", "orders-2", "payments-1"):
        client.init_producer_id(name)

    def listed(pattern: str | None) -> tuple[ErrorCode, list[str]]:
        response = client.request(
            66,
            2,
            state_filters=[],
            producer_id_filters=[],
            duration_filter=-1,
            transactional_id_pattern=pattern,
        )
        names = sorted(str(state.transactional_id) for state in response.transaction_states)
        return ErrorCode(response.error_code), names

    assert listed("orders-.*") == (ErrorCode.none, ["orders-1", "orders-2"])
    assert listed("orders") == (ErrorCode.none, [])  # the whole id must match
    assert listed(None) == (ErrorCode.none, ["orders-1", "orders-2", "payments-1"])
    assert listed("orders-(") == (ErrorCode.invalid_regular_expression, [])
