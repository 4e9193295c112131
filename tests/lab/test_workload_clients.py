"""The lab's client configs against its FaultProxy: a reset of every connection must not wedge a
worker's transactional producer (the lab's exactly-once stalls came from exactly that)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker
from onceflow.faults.proxy import FaultPlan, FaultProxy
from onceflow.lab.presets import EXACTLY_ONCE
from onceflow.lab.workload import producer_config


@pytest.fixture
def proxied_broker() -> Iterator[tuple[FaultProxy, str]]:
    """A broker that advertises the proxy, so clients send every request through it."""
    with FaultProxy(FaultPlan(seed=1)) as proxy:
        with EmbeddedBroker(config={"advertised.listeners": f"PLAINTEXT://{proxy.address}"}) as broker:
            proxy.upstream = ("127.0.0.1", int(broker.bootstrap_servers.rsplit(":", 1)[1]))
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            for future in admin.create_topics([NewTopic(t, 1, 1) for t in ("input", "output")]).values():
                future.result(timeout=30)
            yield proxy, broker.bootstrap_servers


@pytest.mark.timeout(90)
def test_send_offsets_to_transaction_survives_every_connection_being_reset(
    proxied_broker: tuple[FaultProxy, str],
) -> None:
    proxy, direct = proxied_broker
    group = Consumer({"bootstrap.servers": direct, "group.id": "lab"}).consumer_group_metadata()
    producer = Producer(producer_config(proxy.address, EXACTLY_ONCE, "lab-worker-0"))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce("output", value=b"first")
    # The producer learns (and caches) the group coordinator here.
    producer.send_offsets_to_transaction([TopicPartition("input", 0, 1)], group, 30)
    producer.commit_transaction(30)

    proxy.plan.drop_response_probability = 1.0  # every response lost: the client has no broker up
    producer.begin_transaction()
    producer.produce("output", value=b"second")
    producer.poll(0.5)
    proxy.plan.drop_response_probability = 0.0
    assert proxy.responses_dropped > 0

    # librdkafka ignores the call's timeout when it hangs, so the call runs in a thread we can
    # give up on (a daemon: a wedged one must not hold the test run at exit).
    sent = threading.Event()

    def send_offsets() -> None:
        producer.send_offsets_to_transaction([TopicPartition("input", 0, 2)], group, 10)
        sent.set()

    threading.Thread(target=send_offsets, daemon=True).start()
    assert sent.wait(20), "send_offsets_to_transaction hung after the connections were reset"
    producer.commit_transaction(30)
