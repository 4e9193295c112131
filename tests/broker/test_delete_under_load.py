"""Deleting a topic while acks=all producers write to it: the broker keeps answering."""

from __future__ import annotations

import contextlib
import threading
import time

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker


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
