"""The main job until the lab lands: an idempotent round trip on an embedded broker."""

from __future__ import annotations

import time
from collections import Counter

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from onceflow.embedded import EmbeddedBroker

TOPIC = "payments"
PARTITIONS = 4


def run_demo(messages: int) -> int:
    console = Console()
    with EmbeddedBroker() as broker:
        console.print(f"embedded broker on [bold]{broker.bootstrap_servers}[/], data in {broker.data_dir}")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=30)

        producer = Producer(
            {"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True, "linger.ms": 5}
        )
        acked: Counter[int] = Counter()
        errors: list[str] = []

        def on_delivery(error: object, message: object) -> None:
            if error is not None:
                errors.append(str(error))
            else:
                acked[message.partition()] += 1  # type: ignore[attr-defined]

        started = time.monotonic()
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("producing (acks=all, idempotent)", total=messages)
            for number in range(messages):
                producer.produce(
                    TOPIC, key=f"account-{number % 97}", value=f"payment-{number}", on_delivery=on_delivery
                )
                producer.poll(0)
                progress.advance(task)
            producer.flush(60)
        produce_s = time.monotonic() - started

        consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": "demo", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition(TOPIC, partition, 0) for partition in range(PARTITIONS)])
        seen: Counter[str] = Counter()
        started = time.monotonic()
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("consuming", total=messages)
            deadline = time.monotonic() + 60
            while sum(seen.values()) < messages and time.monotonic() < deadline:
                for message in consumer.consume(1000, timeout=0.5):
                    value = message.value()
                    if message.error() is None and value is not None:
                        seen[value.decode()] += 1
                        progress.advance(task)
        consume_s = time.monotonic() - started
        consumer.close()

    table = Table(title="idempotent round trip")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("sent", str(messages))
    table.add_row("acknowledged", str(sum(acked.values())))
    table.add_row("read back", str(len(seen)))
    table.add_row("lost", str(messages - len(seen)))
    table.add_row("duplicated", str(sum(count - 1 for count in seen.values() if count > 1)))
    table.add_row("produce time", f"{produce_s:.2f} s")
    table.add_row("consume time", f"{consume_s:.2f} s")
    console.print(table)
    ok = not errors and len(seen) == messages and all(count == 1 for count in seen.values())
    console.print("[green]every message stored exactly once[/]" if ok else f"[red]FAILED[/] {errors[:3]}")
    return 0 if ok else 1
