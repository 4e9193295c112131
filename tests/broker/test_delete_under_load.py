"""Deleting a topic while its partitions are written or searched: the broker keeps answering."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from tests.conftest import wait_until
from tests.wire import WireClient


def test_a_topic_deleted_under_acks_all_produce_leaves_the_broker_answering() -> None:
    # A flush of the topic is under way at almost any moment of this load; the deletion closes
    # the topic's files on the event loop, where that flush ends (a `close` that waited for it
    # hung the broker: found by `onceflow fuzz`).
    with EmbeddedBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        stop = threading.Event()
        acked: list[int] = []

        def produce(topic: str) -> None:
            producer = Producer(
                {"bootstrap.servers": broker.bootstrap_servers, "acks": "all", "linger.ms": 0}
            )

            def delivered(error: KafkaError | None, _message: Message) -> None:
                acked.append(error is None)

            while not stop.is_set():
                with contextlib.suppress(BufferError):  # the local queue is full: the broker catches up
                    producer.produce(topic, b"v" * 100, on_delivery=delivered)
                producer.poll(0.001)
            producer.flush(5)

        for round_number in range(5):
            topic = f"doomed-{round_number}"
            admin.create_topics([NewTopic(topic, 2)])[topic].result(timeout=30)
            acked.clear()
            stop.clear()
            writer = threading.Thread(target=produce, args=(topic,))
            writer.start()
            deadline = time.monotonic() + 30
            while sum(acked) < 200 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sum(acked) >= 200, "the producer got no acks before the deletion"
            admin.delete_topics([topic])[topic].result(timeout=30)
            stop.set()
            writer.join(timeout=30)
            try:
                admin.list_topics(timeout=10)  # the producer may have created it again meanwhile
            except KafkaException as error:
                raise AssertionError(f"the broker stopped answering after deleting {topic}") from error
        after = Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})
        after.produce("after", b"v")
        assert after.flush(30) == 0, "acks=all answers stopped: the flushes are stuck"


def test_a_topic_deleted_while_a_search_by_timestamp_waits_leaves_the_broker_answering(
    broker: EmbeddedBroker,
) -> None:
    # A ListOffsets search by timestamp reads the segments on the record thread. Found by
    # `onceflow fuzz`: the search held its topic's files across the wait for that thread, and a
    # deletion then waited on the event loop for a search that needed the loop to let go.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic("searched", 1)])["searched"].result(timeout=30)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce("searched", b"v", timestamp=1_000)
    assert producer.flush(30) == 0
    record_thread = broker._server.broker._record_thread if broker._server else None
    assert record_thread is not None
    gate = threading.Event()
    record_thread.submit(gate.wait, 60)  # the thread is busy: the search queues behind this
    answers: list[Any] = []

    def search() -> None:
        with WireClient(broker.bootstrap_servers, timeout_s=60) as wire:
            topics = [{"name": "searched", "partitions": [{"partition_index": 0, "timestamp": 500}]}]
            answers.append(wire.request(2, 7, replica_id=-1, isolation_level=0, topics=topics))

    searching = threading.Thread(target=search)
    searching.start()
    try:
        wait_until(lambda: record_thread._work_queue.qsize() == 1, timeout_s=30)
        admin.delete_topics(["searched"])["searched"].result(timeout=30)
    finally:
        gate.set()
        searching.join(timeout=60)
    (answer,) = answers
    assert answer.topics[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    assert admin.list_topics(timeout=10).brokers  # and the broker answers on
