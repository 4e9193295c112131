"""The booking watcher's negative control: a booking whose two rows commit in separate transactions
is caught between the two commits; rows committed in one transaction never are."""

from __future__ import annotations

import json

from confluent_kafka import Producer

from onceflow import EmbeddedBroker
from onceflow.pipeline.events import ORDER_STATUS_TOPIC, SEAT_RESERVATIONS_TOPIC
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
