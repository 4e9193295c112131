"""Transactional producers of three clients commit some transactions and abort others; readers
with read_committed see exactly the committed records, readers with read_uncommitted see all."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow import EmbeddedBroker
from tests.support import read_to_end, values

PARTITIONS = 2
TRANSACTIONS = 6  # even ones commit, odd ones abort
PER_TRANSACTION = 10


def _value(client: str, transaction: int, index: int) -> str:
    return f"{client}-{transaction}-{index}"


def _expected(client: str, committed: bool) -> set[str]:
    return {
        _value(client, transaction, index)
        for transaction in range(TRANSACTIONS)
        if not committed or transaction % 2 == 0
        for index in range(PER_TRANSACTION)
    }


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


def _topic(broker: EmbeddedBroker, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(timeout=30)
    return name


def _read_confluent(broker: EmbeddedBroker, topic: str, isolation: str) -> list[str]:
    return values(read_to_end(broker.bootstrap_servers, topic, PARTITIONS, isolation))


def _read_kafka_python(broker: EmbeddedBroker, topic: str, isolation: str) -> list[str]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers,
        isolation_level=isolation,
        enable_auto_commit=False,
        consumer_timeout_ms=2000,
    )
    consumer.assign([KTopicPartition(topic, partition) for partition in range(PARTITIONS)])
    consumer.seek_to_beginning()
    values = [message.value.decode() for message in consumer]
    consumer.close()
    return values


def _check_readers(broker: EmbeddedBroker, topic: str, client: str) -> None:
    for read in (_read_confluent, _read_kafka_python):
        committed = read(broker, topic, "read_committed")
        assert sorted(committed) == sorted(_expected(client, committed=True)), read.__name__
        everything = read(broker, topic, "read_uncommitted")
        assert sorted(everything) == sorted(_expected(client, committed=False)), read.__name__


def test_confluent_kafka_transactions(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "txn-confluent")
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "confluent-1"})
    producer.init_transactions(30)
    for transaction in range(TRANSACTIONS):
        producer.begin_transaction()
        for index in range(PER_TRANSACTION):
            producer.produce(
                topic, key=str(index), value=_value("confluent", transaction, index), partition=index % 2
            )
        if transaction % 2 == 0:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # the aborted records really reach the log first
            producer.abort_transaction(30)
    _check_readers(broker, topic, "confluent")


def test_kafka_python_transactions(broker: EmbeddedBroker) -> None:
    from kafka import KafkaProducer

    topic = _topic(broker, "txn-kafka-python")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, transactional_id="kafka-python-1")
    producer.init_transactions()
    for transaction in range(TRANSACTIONS):
        producer.begin_transaction()
        for index in range(PER_TRANSACTION):
            producer.send(
                topic, value=_value("kafka-python", transaction, index).encode(), partition=index % 2
            )
        producer.flush()
        if transaction % 2 == 0:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()
    _check_readers(broker, topic, "kafka-python")


def test_aiokafka_transactions(broker: EmbeddedBroker) -> None:
    from aiokafka import AIOKafkaProducer

    topic = _topic(broker, "txn-aiokafka")

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, transactional_id="aiokafka-1")
        await producer.start()
        try:
            for transaction in range(TRANSACTIONS):
                await producer.begin_transaction()
                for index in range(PER_TRANSACTION):
                    await producer.send_and_wait(
                        topic, value=_value("aiokafka", transaction, index).encode(), partition=index % 2
                    )
                if transaction % 2 == 0:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(scenario())
    _check_readers(broker, topic, "aiokafka")


def test_a_second_producer_fences_the_first(broker: EmbeddedBroker) -> None:
    topic = _topic(broker, "txn-fencing")
    config = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "fenced-id"}
    zombie = Producer(config)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", partition=0)
    zombie.flush(30)

    successor = Producer(config)
    successor.init_transactions(30)  # aborts the zombie's open transaction
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", partition=1)
    successor.commit_transaction(30)

    with pytest.raises(Exception) as fenced:
        zombie.produce(topic, value=b"late zombie", partition=0)
        zombie.commit_transaction(10)
    assert "fenced" in str(fenced.value).lower()
    assert _read_confluent(broker, topic, "read_committed") == ["successor"]
