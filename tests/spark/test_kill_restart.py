"""onceflow source -> flaky transform -> onceflow sink, with the driver SIGKILLed.

The output must hold every committed input exactly once, under failed task attempts
(`local[2,4]`), speculative attempts, and restarts from the checkpoint. The at-least-once sink
under the same kind of faults must duplicate, which shows the check can fail.
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


def feed(bootstrap: str) -> list[str]:
    """Creates the topics and writes the first inputs; returns the committed ones."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic("input", PARTITIONS, 1), NewTopic("output", PARTITIONS, 1)]
    ).values():
        future.result(timeout=30)
    first = [f"v{n}" for n in range(4000)]
    return produce_transactions(bootstrap, "input", first, 500, abort_every=4, transactional_id="feed-1")


def stream_job(bootstrap: str, tmp_path: Path, guarantee: str, master: str, *extra: str) -> StreamJob:
    (tmp_path / "faults").mkdir()
    return StreamJob(
        "--bootstrap",
        bootstrap,
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--faults-dir",
        str(tmp_path / "faults"),
        "--master",
        master,
        "--guarantee",
        guarantee,
        *extra,
        log=tmp_path / "job.log",
    )


def run_with_driver_kill(
    broker: BrokerProcess, tmp_path: Path, guarantee: str, master: str, *extra: str
) -> tuple[list[str], list[str], list[str]]:
    """Returns (committed inputs, output values, injected faults)."""
    bootstrap = broker.bootstrap_servers
    committed = feed(bootstrap)
    job = stream_job(bootstrap, tmp_path, guarantee, master, *extra)
    # The worst moment: batch 0 is written but not in the checkpoint when the driver dies. (A kill
    # at an arbitrary moment, mid-stream, is the pipeline's crash test, tests/pipeline/test_crash.py.)
    job.start(env={"ONCEFLOW_FAILPOINTS": "spark.sink.commit"})
    assert job.wait_exit(180) == -signal.SIGKILL

    # More input while the driver is down.
    second = [f"w{n}" for n in range(2000)]
    committed += produce_transactions(
        bootstrap, "input", second, 400, abort_every=3, transactional_id="feed-2"
    )
    return committed, *run_to_the_end(job, bootstrap, tmp_path)


def run_to_the_end(job: StreamJob, bootstrap: str, tmp_path: Path) -> tuple[list[str], list[str]]:
    """Runs the job until it has read all the input; returns (output values, injected faults)."""
    job.start()
    job.wait_for(reached(lsos(bootstrap)), 240, "the job to reach the end of the input")
    job.kill()
    output = values(read_to_end(bootstrap, "output", PARTITIONS, isolation="read_committed"))
    return output, sorted(path.name for path in (tmp_path / "faults").iterdir())


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
    # The driver killed with batch 0 written but not in the checkpoint: the restart writes it again.
    committed = feed(broker_process.bootstrap_servers)
    job = stream_job(broker_process.bootstrap_servers, tmp_path, "at-least-once", "local[2,4]")
    job.start(env={"ONCEFLOW_FAILPOINTS": "spark.sink.commit"})
    assert job.wait_exit(180) == -signal.SIGKILL
    output, faults = run_to_the_end(job, broker_process.bootstrap_servers, tmp_path)
    assert any(fault.endswith("-failed") for fault in faults)
    counts = Counter(output)
    assert set(counts) == set(expected(committed)), "at-least-once may duplicate but never lose"
    assert max(counts.values()) > 1, "the restart should have written batch 0 again"


@pytest.mark.timeout(480)
@pytest.mark.cluster
def test_exactly_once_with_speculative_attempts(broker_process: BrokerProcess, tmp_path: Path) -> None:
    # Speculation needs a cluster with two hosts: Spark never speculates in local mode, nor runs
    # a copy of a task on a host that already runs it. Driver kills are the test above's. The
    # source reads the four partitions in two tasks, so a speculative copy reads several too.
    committed = feed(broker_process.bootstrap_servers)
    with standalone_cluster(tmp_path, worker_hosts=("127.0.0.1", "localhost")) as master:
        job = stream_job(
            broker_process.bootstrap_servers,
            tmp_path,
            "exactly-once",
            master,
            "--slow-first-attempts",
            "--max-partitions",
            "2",
        )
        output, faults = run_to_the_end(job, broker_process.bootstrap_servers, tmp_path)
    assert any(fault.endswith("-slow") for fault in faults)
    assert any(fault.endswith("-retry") for fault in faults), "no speculative attempt ran"
    assert Counter(output) == expected(committed)
