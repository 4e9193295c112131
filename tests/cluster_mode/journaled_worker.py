"""A consume-transform-produce worker that keeps a journal of its transactions' outcomes.

Like tests/transactions/processor.py (exactly-once: its offsets go into its transactions), but it
aborts every `ABORT_EVERY`th transaction after writing its output, so that the output topic holds
aborted records, and it stamps each output record with its transaction ("out:INPUT:TOKEN") and
appends "commit TOKEN" or "abort TOKEN" to its journal once the broker answered the commit or the
abort. A read_committed reader that reads a record of an aborted token has read aborted data; a
transaction whose answer never came (the worker exits on any error and is started again) has no
line, and proves nothing either way. The journal is the oracle: it is written by the client, not
read from the system under test.
"""

from __future__ import annotations

import os
import sys
import time

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from onceflow.client_watchdog import exit_if_stuck, records_or_exit

ABORT_EVERY = 5
PROCESSING_S = 0.02


def main(bootstrap: str, group: str, transactional_id: str, journal_path: str) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
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
            "socket.timeout.ms": 5000,
        }
    )
    producer.init_transactions(60)
    consumer.subscribe(["input"])
    with open(journal_path, "a", buffering=1) as journal:
        count = 0
        while True:
            messages = records_or_exit(consumer.consume(200, timeout=0.2))
            if not messages:
                continue
            count += 1
            token = f"{os.getpid()}.{count}"
            producer.begin_transaction()
            for message in messages:
                value = message.value() or b""
                producer.produce("output", key=message.key(), value=b"out:" + value + b":" + token.encode())
            time.sleep(PROCESSING_S)
            if count % ABORT_EVERY == 0:
                producer.flush(30)  # in the log, then aborted
                producer.abort_transaction(30)
                journal.write(f"abort {token}\n")
                _rewind(consumer, messages)  # their input is processed again
                continue
            with exit_if_stuck(30, "send_offsets_to_transaction"):
                producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
                )
            producer.commit_transaction(30)
            journal.write(f"commit {token}\n")


def _rewind(consumer: Consumer, messages: list[Message]) -> None:
    """Back to the first record of the batch in each partition."""
    first: dict[tuple[str, int], int] = {}
    for message in messages:
        key = (message.topic() or "", message.partition() or 0)
        first[key] = min(first.get(key, message.offset() or 0), message.offset() or 0)
    for (topic, partition), offset in first.items():
        consumer.seek(TopicPartition(topic, partition, offset))


if __name__ == "__main__":
    main(*sys.argv[1:])
