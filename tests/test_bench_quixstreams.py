"""The spark benchmark's quixstreams reference (`benchmarks/quix_payments.py`) against onceflow.

It runs in `.venv-quixstreams`, which `make bench` makes; `make test` never does, so without it
the test is skipped. Marked `wheel`: like the wheel test it needs a venv of its own from PyPI.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "benchmarks" / "quix_payments.py"
VENV_PYTHON = ROOT / ".venv-quixstreams" / "bin" / "python"
PARTITIONS = 4
RECORDS = 200


@pytest.mark.wheel
@pytest.mark.skipif(not VENV_PYTHON.exists(), reason="no .venv-quixstreams: `make bench` makes it")
def test_quixstreams_writes_each_record_transformed_exactly_once(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic("quix-in", PARTITIONS, 1)])["quix-in"].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    values = [f"payment {number} captured".encode() for number in range(RECORDS)]
    failures: list[KafkaError] = []
    for number, value in enumerate(values):
        producer.produce(
            "quix-in",
            value,
            partition=number % PARTITIONS,
            on_delivery=lambda error, _: failures.append(error),
        )
    assert producer.flush(30) == 0
    assert [error for error in failures if error is not None] == []
    finished = subprocess.run(
        [
            str(VENV_PYTHON),
            str(SCRIPT),
            *("--bootstrap", broker.bootstrap_servers, "--topic", "quix-in", "--output-topic", "quix-out"),
            *("--partitions", str(PARTITIONS), "--records", str(RECORDS)),
            *("--consumer-group", "quix-test", "--state-dir", str(tmp_path / "state")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
    figures = json.loads(finished.stdout.strip().splitlines()[-1])
    assert figures["records"] == RECORDS and figures["records_per_s"] > 0

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": "quix-test-check",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    partitions = [TopicPartition("quix-out", partition, 0) for partition in range(PARTITIONS)]
    consumer.assign(partitions)
    outputs: list[bytes] = []
    at_end: set[int] = set()
    for _ in range(200):  # bounded: each poll waits at most 0.1 s
        for message in consumer.consume(1000, timeout=0.1):
            error = message.error()
            if error is None:
                outputs.append(message.value())
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
            else:
                raise KafkaException(error)
        if len(at_end) == PARTITIONS:
            break
    consumer.close()
    assert sorted(outputs) == sorted(value.upper() + b"!" for value in values)
