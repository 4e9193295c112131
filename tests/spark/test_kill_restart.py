"""onceflow source -> flaky transform -> onceflow sink, with the driver SIGKILLed twice.

The output must hold every committed input exactly once, under failed task attempts
(`local[2,4]`), speculative attempts, and a restart from the checkpoint. The same run with the
at-least-once sink must duplicate, which shows the test can fail.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess
from tests.spark.helpers import StreamJob, produce_transactions, reached
from tests.spark_cluster import standalone_cluster
from tests.support import read_to_end, values
from tests.wire import WireClient

pytestmark = [pytest.mark.spark, pytest.mark.soak]

PARTITIONS = 4


def lsos(bootstrap: str) -> dict[str, dict[str, int]]:
    with WireClient(bootstrap) as client:
        return {
            "input": {
                str(partition): client.list_offset("input", partition, -1, isolation_level=1)
                for partition in range(PARTITIONS)
            }
        }


def run_with_driver_kill(
    broker: BrokerProcess, tmp_path: Path, guarantee: str, master: str, *extra: str
) -> tuple[list[str], list[str], list[str]]:
    """Returns (committed inputs, output values, injected faults)."""
    bootstrap = broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic("input", PARTITIONS, 1), NewTopic("output", PARTITIONS, 1)]
    ).values():
        future.result(timeout=30)
    first = [f"v{n}" for n in range(4000)]
    committed = produce_transactions(bootstrap, "input", first, 500, abort_every=4, transactional_id="feed-1")

    faults = tmp_path / "faults"
    faults.mkdir()
    job = StreamJob(
        "--bootstrap",
        bootstrap,
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--faults-dir",
        str(faults),
        "--master",
        master,
        "--guarantee",
        guarantee,
        *extra,
        log=tmp_path / "job.log",
    )
    # First the worst moment: batch 0 is written but not in the checkpoint when the driver dies.
    job.start(env={"ONCEFLOW_FAILPOINTS": "spark.sink.commit"})
    assert job.wait_exit(180) == -signal.SIGKILL
    # Then an arbitrary one, mid-stream.
    job.start()
    job.wait_for(lambda progress: len(progress) >= 3, 180, "three micro-batches")
    job.kill()

    second = [f"w{n}" for n in range(2000)]
    committed += produce_transactions(
        bootstrap, "input", second, 400, abort_every=3, transactional_id="feed-2"
    )
    job.start()
    job.wait_for(reached(lsos(bootstrap)), 240, "the restarted job to reach the end of the input")
    job.kill()
    output = values(read_to_end(bootstrap, "output", PARTITIONS, isolation="read_committed"))
    return committed, output, sorted(path.name for path in faults.iterdir())


def expected(committed: list[str]) -> Counter[str]:
    return Counter(f"{value}|done" for value in committed)


@pytest.mark.timeout(480)
def test_exactly_once_through_task_failures_and_a_driver_kill(
    broker_process: BrokerProcess, tmp_path: Path
) -> None:
    committed, output, faults = run_with_driver_kill(broker_process, tmp_path, "exactly-once", "local[2,4]")
    assert any(fault.endswith("-failed") for fault in faults)
    assert any(fault.endswith("-retry") for fault in faults)
    assert Counter(output) == expected(committed)


@pytest.mark.timeout(480)
def test_at_least_once_duplicates_under_the_same_faults(
    broker_process: BrokerProcess, tmp_path: Path
) -> None:
    committed, output, faults = run_with_driver_kill(broker_process, tmp_path, "at-least-once", "local[2,4]")
    assert any(fault.endswith("-failed") for fault in faults)
    counts = Counter(output)
    assert set(counts) == set(expected(committed)), "at-least-once may duplicate but never lose"
    assert max(counts.values()) > 1, "the faults should have duplicated some records"


@pytest.mark.timeout(480)
@pytest.mark.cluster
def test_exactly_once_with_speculative_attempts(broker_process: BrokerProcess, tmp_path: Path) -> None:
    # Speculation needs a cluster with two hosts: Spark never speculates in local mode, nor runs
    # a copy of a task on a host that already runs it.
    with standalone_cluster(tmp_path, worker_hosts=("127.0.0.1", "localhost")) as master:
        committed, output, faults = run_with_driver_kill(
            broker_process, tmp_path, "exactly-once", master, "--slow-first-attempts"
        )
    assert any(fault.endswith("-slow") for fault in faults)
    assert any(fault.endswith("-retry") for fault in faults), "no speculative attempt ran"
    assert Counter(output) == expected(committed)
