"""The line of broker metrics a lab run ends with, read from a real broker while a transaction runs."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer

from onceflow import EmbeddedBroker
from onceflow.lab.broker_metrics import BrokerMetrics, scrape, summaries

VALUE = b"x" * 1000


def test_the_digest_follows_a_transaction(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path, metrics_port=0) as broker:
        idle = scrape(broker.metrics_url)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "digest"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for _ in range(20):
            producer.produce("digest", VALUE)
        assert producer.flush(30) == 0
        open_ = scrape(broker.metrics_url)
        producer.commit_transaction(30)
        done = scrape(broker.metrics_url)
    assert (idle.bytes_in, idle.flushes, idle.open_transactions) == (0, 0, 0)
    assert open_.open_transactions == 1 and done.open_transactions == 0
    assert open_.requests.get("EndTxn", 0) == 0 and done.requests["EndTxn"] == 1
    assert done.requests["Produce"] >= 1 and done.requests["InitProducerId"] == 1
    assert 20 * len(VALUE) <= done.bytes_in < 21 * len(VALUE) + 1000  # the batch, plus its marker
    assert done.flushes >= 2 and done.flush_p99_s > 0
    line = done.summary()
    assert "Produce" in line and "EndTxn 1" in line and "0 transactions open" in line


def test_runs_without_metrics_get_no_line() -> None:
    measured = BrokerMetrics(requests={"Produce": 3.0}, bytes_in=2e6, flushes=4, flush_p99_s=0.005).to_json()
    runs = [
        {"guarantee": "exactly-once", "faults": ["lost-acks"], "broker_metrics": measured},
        {"guarantee": "at-most-once", "faults": [], "broker_metrics": None},
    ]
    [line] = summaries(runs)
    assert line.startswith("broker of lab exactly-once / lost-acks: 3 requests (Produce 3)")
    assert "2.00 MB in" in line and "4 fsyncs p99 ≤ 5 ms" in line
