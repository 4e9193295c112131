"""Prometheus metrics (`onceflow broker --metrics`): scraped over HTTP while real clients run."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from onceflow import EmbeddedBroker
from tests.conftest import BrokerProcess

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

TOPIC = "payments"
IDEMPOTENT_RECORDS = 20
TRANSACTIONAL_RECORDS = 5
VALUE = b"v" * 100
COMMITTED = 10


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over the series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


@pytest.fixture
def broker_with_metrics(tmp_path: Path) -> Iterator[tuple[BrokerProcess, str]]:
    process = BrokerProcess(tmp_path / "data")
    process.extra_args = ["--metrics", "127.0.0.1:0"]
    process.start()  # it reads the metrics line too
    assert process.metrics_url is not None and process.metrics_url.startswith("http://"), process.metrics_url
    yield process, process.metrics_url
    process.terminate()


def test_metrics_follow_producers_transactions_and_groups(
    broker_with_metrics: tuple[BrokerProcess, str],
) -> None:
    broker, url = broker_with_metrics
    bootstrap = broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1)])[TOPIC].result(timeout=30)
    with pytest.raises(Exception, match="already exists"):
        admin.create_topics([NewTopic(TOPIC, 1)])[TOPIC].result(timeout=30)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for _ in range(IDEMPOTENT_RECORDS):
        producer.produce(TOPIC, VALUE)
    assert producer.flush(30) == 0

    # A transaction left open: it holds the LSO at its first offset.
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": "metrics-open"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for _ in range(TRANSACTIONAL_RECORDS):
        transactional.produce(TOPIC, VALUE)
    assert transactional.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "metrics-group",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    consumed = []
    deadline = time.monotonic() + 60
    while len(consumed) < COMMITTED and time.monotonic() < deadline:
        consumed += [m for m in consumer.consume(COMMITTED - len(consumed), timeout=1) if m.error() is None]
    assert len(consumed) == COMMITTED
    consumer.commit(message=consumed[-1], asynchronous=False)

    produced = IDEMPOTENT_RECORDS + TRANSACTIONAL_RECORDS
    samples = scrape(url)
    requests = "kafka_network_requestmetrics_requests_total"
    assert value(samples, requests, request="Produce", api_key="0") > 0
    assert value(samples, requests, request="Fetch", api_key="1") > 0
    assert value(samples, requests, request="EndTxn", api_key="26") == 0
    assert total(samples, "kafka_network_requestmetrics_total_time_seconds_count", request="Produce") == (
        value(samples, requests, request="Produce", api_key="0")
    )
    errors = "kafka_network_requestmetrics_errors_total"
    assert value(samples, errors, request="CreateTopics", api_key="19", error="TOPIC_ALREADY_EXISTS") == 1
    assert value(samples, errors, request="Produce", api_key="0", error="NONE") > 0

    assert value(samples, "kafka_server_brokertopicmetrics_bytes_in_total", topic=TOPIC) >= produced * len(
        VALUE
    )
    assert value(samples, "kafka_server_brokertopicmetrics_messages_in_total", topic=TOPIC) == produced
    assert value(samples, "kafka_server_brokertopicmetrics_bytes_out_total", topic=TOPIC) >= (
        COMMITTED * len(VALUE)
    )
    assert value(samples, "kafka_log_logflushstats_log_flush_seconds_count") > 0
    # Linux AIO is there on these machines: the common flush must have gone to the kernel.
    assert value(samples, "onceflow_log_flushes_total", how="linux_aio") > 0

    assert value(samples, "onceflow_transactions_open") == 1
    assert value(samples, "onceflow_transactions_oldest_open_age_seconds") > 0
    lso_lag = "kafka_cluster_partition_last_stable_offset_lag"
    assert value(samples, lso_lag, topic=TOPIC, partition="0") == TRANSACTIONAL_RECORDS

    group = {"consumergroup": "metrics-group", "topic": TOPIC, "partition": "0"}
    assert value(samples, "kafka_consumergroup_current_offset", **group) == COMMITTED
    assert value(samples, "kafka_consumergroup_lag", **group) == produced - COMMITTED

    # payments, and the internal topics' 50 partitions each (Kafka's defaults), all led here
    assert value(samples, "kafka_server_replicamanager_partition_count") == 1 + 50 + 50
    assert value(samples, "kafka_server_replicamanager_leader_count") == 1 + 50 + 50
    assert ("kafka_server_replicamanager_under_replicated_partitions", frozenset()) in samples
    assert value(samples, "kafka_server_replicamanager_under_min_isr_partition_count") == 0
    assert value(samples, "kafka_controller_kafkacontroller_active_controller_count") == 1
    assert value(samples, "kafka_controller_kafkacontroller_offline_partitions_count") == 0
    partition = {"topic": TOPIC, "partition": "0"}
    assert value(samples, "kafka_log_log_log_end_offset", **partition) == produced
    assert value(samples, "onceflow_partition_high_watermark", **partition) == produced
    assert value(samples, "onceflow_partition_last_stable_offset", **partition) == IDEMPOTENT_RECORDS
    assert value(samples, "kafka_log_log_size", **partition) > produced * len(VALUE)
    groups = "kafka_coordinator_group_groupmetadatamanager_num_groups"
    assert value(samples, groups, state="Stable") == 1
    assert value(samples, "kafka_coordinator_group_groupmetadatamanager_num_offsets") == 1
    assert value(samples, "onceflow_transactional_ids", state="Ongoing") == 1
    assert ("onceflow_coordinator_load_seconds", frozenset({("coordinator", "group")})) in samples

    transactional.commit_transaction(30)
    samples = scrape(url)
    assert value(samples, "onceflow_transactions_open") == 0
    assert value(samples, "onceflow_transactions_oldest_open_age_seconds") == 0
    assert value(samples, lso_lag, topic=TOPIC, partition="0") == 0
    assert value(samples, "kafka_network_requestmetrics_requests_total", request="EndTxn", api_key="26") == 1
    # The COMMIT marker takes an offset too.
    assert value(samples, "kafka_consumergroup_lag", **group) == produced + 1 - COMMITTED
    consumer.close()


def test_each_embedded_broker_has_its_own_registry(tmp_path: Path) -> None:
    with (
        EmbeddedBroker(tmp_path / "a", metrics_port=0) as first,
        EmbeddedBroker(tmp_path / "b", metrics_port=0) as second,
    ):
        producer = Producer({"bootstrap.servers": first.bootstrap_servers})
        producer.produce("only-on-first", VALUE)
        assert producer.flush(30) == 0
        bytes_in = "kafka_server_brokertopicmetrics_bytes_in_total"
        assert value(scrape(first.metrics_url), bytes_in, topic="only-on-first") >= len(VALUE)
        assert value(scrape(second.metrics_url), bytes_in, topic="only-on-first") == 0


def test_only_metrics_is_served(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path, metrics_port=0) as broker:
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(broker.metrics_url.replace("/metrics", "/other"), timeout=10)
        assert missing.value.code == 404
        request = urllib.request.Request(broker.metrics_url, data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as posted:
            urllib.request.urlopen(request, timeout=10)
        assert posted.value.code == 405


def test_stage_times_cover_a_produce_to_consume_round_trip(
    broker_with_metrics: tuple[BrokerProcess, str],
) -> None:
    broker, url = broker_with_metrics
    bootstrap = broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("stages", 1)])["stages"].result(timeout=30)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "stages",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10_000,
        }
    )
    consumer.assign([TopicPartition("stages", 0, 0)])
    assert consumer.poll(1) is None  # its next fetch waits at the high watermark
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    producer.produce("stages", VALUE)
    assert producer.flush(30) == 0
    message = consumer.poll(8)  # well before the fetch's own 10 s timeout: a wake-up brought it
    assert message is not None and message.value() == VALUE
    consumer.close()

    samples = scrape(url)
    for stage in ("decode_to_append", "fsync_wait", "fsync_to_answer", "hw_to_fetch_wakeup"):
        assert value(samples, "onceflow_stage_seconds_count", stage=stage) >= 1, stage
        assert value(samples, "onceflow_stage_seconds_sum", stage=stage) > 0, stage
