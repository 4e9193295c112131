"""The booking watcher's negative control: a booking whose two rows commit in separate transactions
is caught between the two commits; rows committed in one transaction never are."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from onceflow import EmbeddedBroker
from onceflow.pipeline.events import ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC, ensure_output_topics
from onceflow.pipeline.process import CommittedReader, payment_id
from tests.pipeline.conftest import PairWatch


def commit(producer: Producer, rows: list[tuple[str, str]]) -> None:
    """One transaction with a row per (topic, payment id)."""
    producer.begin_transaction()
    for topic, payment in rows:
        producer.produce(topic, json.dumps({"payment_id": payment}, separators=(",", ":")).encode())
    producer.commit_transaction(30)


def test_the_watcher_sees_a_booking_whose_rows_commit_apart(broker: EmbeddedBroker) -> None:
    watch = PairWatch(broker.bootstrap_servers)  # not started: each step runs here, in order
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "half"})
    producer.init_transactions(30)
    try:
        commit(producer, [(ORDER_STATUS_TOPIC, "together"), (SEAT_RESERVATIONS_TOPIC, "together")])
        commit(producer, [(ORDER_STATUS_TOPIC, "apart")])
        watch.step(ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC)
        watch.step(SEAT_RESERVATIONS_TOPIC, ORDER_STATUS_TOPIC)
        assert watch.violations == ["seen on order-status but not on seat-reservations: ['apart']"]

        # Its second row committed, the booking is whole: no new violation.
        commit(producer, [(SEAT_RESERVATIONS_TOPIC, "apart")])
        watch.step(ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC)
        watch.step(SEAT_RESERVATIONS_TOPIC, ORDER_STATUS_TOPIC)
        assert len(watch.violations) == 1 and watch.checks == 4
    finally:
        producer.flush(10)
        watch.reader.close()


def test_the_reader_stops_at_an_open_transaction_and_reads_it_once_committed(broker: EmbeddedBroker) -> None:
    """The reader's LSOs come from a consumer of their own (the reading one's ListOffsets waited
    behind its Fetch long polls): still read_committed LSOs, so an open transaction ends a read."""
    ensure_output_topics(broker.bootstrap_servers)
    reader = CommittedReader(broker.bootstrap_servers, [ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC])
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "open"})
    producer.init_transactions(30)
    try:
        commit(producer, [(ORDER_STATUS_TOPIC, "committed")])
        producer.begin_transaction()
        producer.produce(
            ORDER_STATUS_TOPIC, json.dumps({"payment_id": "open"}, separators=(",", ":")).encode()
        )
        producer.flush(10)
        first = reader.read_to_end(30)
        assert [payment_id(value) for value in first[ORDER_STATUS_TOPIC]] == ["committed"]
        producer.commit_transaction(30)
        second = reader.read_to_end(30)
        assert [payment_id(value) for value in second[ORDER_STATUS_TOPIC]] == ["open"]
        assert reader.read_to_end(30) == {ORDER_STATUS_TOPIC: [], SEAT_RESERVATIONS_TOPIC: []}
    finally:
        producer.flush(10)
        reader.close()
