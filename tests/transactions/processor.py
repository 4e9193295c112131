"""A consume-transform-produce worker for the exactly-once test.

It reads `input` with a consumer group and writes `output`. In `exactly-once` mode its
consumer offsets go into the same transaction (send_offsets_to_transaction); in
`at-least-once` mode it commits them after the transaction, the way that can duplicate.
Each batch takes some processing time, as real work does. It has no recovery code of its
own: on any error it exits, and its supervisor starts it again, as a crash would."""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, Producer

from onceflow.client_watchdog import exit_if_stuck, records_or_exit

PROCESSING_S = 0.05
# at-least-once: the time between making the output visible and committing the offsets, the
# window in which a crash duplicates. Wide enough that random kills hit it reliably.
COMMIT_GAP_S = 0.2


def main(
    bootstrap: str, slot: str, mode: str, group: str = "transformers", transactional_id: str = ""
) -> None:
    """`transactional_id` (also the group.instance.id): transformer-SLOT unless given."""
    transactional_id = transactional_id or f"transformer-{slot}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # Static membership (KIP-345): a restarted worker takes its partitions back at once
            # instead of stalling the group until the dead member's session expires.
            "group.instance.id": transactional_id,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 10_000,
        }
    )
    producer.init_transactions(30)
    consumer.subscribe(["input"])
    print("ready", flush=True)
    while True:
        messages = records_or_exit(consumer.consume(200, timeout=0.2))
        if not messages:
            continue
        producer.begin_transaction()
        for message in messages:
            producer.produce("output", key=message.key(), value=b"out:" + message.value())
        time.sleep(PROCESSING_S)
        offsets = consumer.position(consumer.assignment())
        if mode == "exactly-once":
            with exit_if_stuck(30, "send_offsets_to_transaction"):
                producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
        else:
            producer.commit_transaction(30)
            time.sleep(COMMIT_GAP_S)
            consumer.commit(offsets=offsets, asynchronous=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
