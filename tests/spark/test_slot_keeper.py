"""The exactly-once sink's slot keeper, without a JVM: write tasks are this test's own calls, and the
executor whose life the keeper follows is a `sleep` process."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from onceflow import EmbeddedBroker
from onceflow.spark import producing, slot_keeper
from onceflow.spark.producing import EXACTLY_ONCE, SinkSettings
from onceflow.spark.slot_keeper import (
    WRITE,
    answer,
    connect,
    keeper_address,
    send_batches,
    write_through_keeper,
)
from tests.broker.test_metrics import scrape, value
from tests.spark.test_data_source import create
from tests.support import read_to_end, values

INIT_PRODUCER_ID = {"request": "InitProducerId", "api_key": "22"}
REQUESTS = "kafka_network_requestmetrics_requests_total"


@pytest.fixture
def owner() -> Iterator[subprocess.Popen[bytes]]:
    """Stands for the process that forks an executor's Python workers: its keeper ends with it."""
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def settings(broker: EmbeddedBroker) -> SinkSettings:
    create(broker.bootstrap_servers, ("out", 2))
    settings = SinkSettings(
        {"bootstrap.servers": broker.bootstrap_servers}, "out", EXACTLY_ONCE, None, "progress", 2, 60_000
    )
    settings.prepare()
    return settings


def rows(*texts: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([text.encode() for text in texts], pa.binary())], names=["value"]
    )


def producers_built(broker: EmbeddedBroker) -> float:
    """Each new transactional producer asks for its id, fencing the last producer of its slot."""
    return value(scrape(broker.metrics_url), REQUESTS, **INIT_PRODUCER_ID)


def test_the_keeper_keeps_each_slots_producer_from_task_to_task(
    broker: EmbeddedBroker, settings: SinkSettings, owner: subprocess.Popen[bytes]
) -> None:
    # Two write tasks at once start the keeper together: one keeper serves both.
    results: dict[int, tuple[int, bool]] = {}

    def first_write(partition: int) -> None:
        results[partition] = write_through_keeper(
            owner.pid, settings, "q", partition, 0, [rows(f"{partition}")]
        )

    tasks = [threading.Thread(target=first_write, args=(partition,)) for partition in (0, 1)]
    for task in tasks:
        task.start()
    for task in tasks:
        task.join(60)
    assert results == {0: (1, False), 1: (1, False)}
    assert producers_built(broker) == 2

    assert write_through_keeper(owner.pid, settings, "q", 0, 1, [rows("a"), rows("b", "c")]) == (3, False)
    # A replay of a batch that landed writes nothing.
    assert write_through_keeper(owner.pid, settings, "q", 0, 1, [rows("again")]) == (0, True)
    assert write_through_keeper(owner.pid, settings, "q", 0, 2, [rows("d")]) == (1, False)
    # A task with no rows still lands its batch (its progress), and a replay skips it.
    assert write_through_keeper(owner.pid, settings, "q", 1, 1, []) == (0, False)
    assert write_through_keeper(owner.pid, settings, "q", 1, 1, [rows("again")]) == (0, True)
    # The producers that wrote batch 0 wrote them all: no task fenced one with a new one.
    assert producers_built(broker) == 2
    committed = values(read_to_end(broker.bootstrap_servers, "out", 2, "read_committed"))
    assert sorted(committed) == ["0", "1", "a", "b", "c", "d"]


def test_a_task_gone_before_its_commit_leaves_nothing_and_its_retry_lands_once(
    broker: EmbeddedBroker, settings: SinkSettings, owner: subprocess.Popen[bytes]
) -> None:
    with connect(owner.pid) as keeper:
        keeper.send((settings, "q", 0, 0))
        assert answer(keeper) == WRITE
        send_batches(keeper, [rows("lost")])
        assert answer(keeper) == 1  # in the broker, in an open transaction; then the task is gone
    assert write_through_keeper(owner.pid, settings, "q", 0, 0, [rows("retried")]) == (1, False)
    assert values(read_to_end(broker.bootstrap_servers, "out", 2, "read_committed")) == ["retried"]


def test_a_keeper_fails_the_task_with_the_slots_error(
    settings: SinkSettings, owner: subprocess.Popen[bytes]
) -> None:
    # Write task 2 has no partition in a progress topic of two.
    with pytest.raises(producing.OptionError, match="write task 2 has no partition in progress topic"):
        write_through_keeper(owner.pid, settings, "q", 2, 0, [rows("x")])


def test_the_keeper_ends_with_its_owner(settings: SinkSettings, owner: subprocess.Popen[bytes]) -> None:
    assert write_through_keeper(owner.pid, settings, "q", 0, 0, [rows("x")]) == (1, False)
    keeper = slot_keeper._started[-1]
    assert keeper.poll() is None
    owner.kill()
    owner.wait()
    assert keeper.wait(10) == 0
    assert not Path(keeper_address(owner.pid)).exists()
