"""Records become visible once fsynced, and a waiting fetch does not wait for the write-behind timer."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from onceflow import EmbeddedBroker
from tests.wire import WireClient, make_batch, produce


def test_acks_1_records_reach_a_long_polling_consumer_quickly(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path, config={"log.flush.interval.ms": "600000"}) as broker:
        with WireClient(broker.bootstrap_servers) as wire:
            wire.create_topic("seen", 1)
            consumer = Consumer(
                {"bootstrap.servers": broker.bootstrap_servers, "group.id": "v", "fetch.wait.max.ms": 5000}
            )
            consumer.assign([TopicPartition("seen", 0, 0)])
            consumer.consume(1, timeout=0.5)  # the consumer is now long-polling at offset 0
            sent = time.monotonic()
            assert produce(wire, "seen", 0, make_batch([b"hello"]), acks=1).error_code == 0
            messages = consumer.consume(1, timeout=10)
            waited = time.monotonic() - sent
            consumer.close()
    assert [message.value() for message in messages] == [b"hello"]
    assert waited < 2, f"the record took {waited:.2f} s to become visible"


def test_list_offsets_latest_is_the_flushed_end(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path, config={"log.flush.interval.ms": "600000"}) as broker:
        with WireClient(broker.bootstrap_servers) as wire:
            wire.create_topic("hw", 1)
            assert produce(wire, "hw", 0, make_batch([b"a", b"b"]), acks=-1).base_offset == 0
            assert wire.list_offset("hw", 0) == 2
