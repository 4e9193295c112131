"""`onceflow broker`: readable errors for bad input, a clean stop on SIGTERM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.cli import main
from tests.conftest import BrokerProcess

ONCEFLOW = [sys.executable, "-m", "onceflow.cli"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ONCEFLOW, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "num.partitions=abc"], "Invalid value abc for configuration num.partitions: Not a number"),
        (["--set", "log.segment.bytes=-5"], "log.segment.bytes: Value must be at least 14"),
        (["--set", "min.insync.replicas=0"], "min.insync.replicas: Value must be at least 1"),
        (["--set", "bogus.key=1"], "unknown broker config bogus.key"),
        (["--zookeper", "127.0.0.1:2181"], "unknown option --zookeper (did you mean --zookeeper?)"),
        (["--set", "novalue"], "expected key=value"),
        (["--listen", "nonsense"], "--listen wants HOST:PORT"),
        (["--metrics", "nonsense"], "--metrics wants HOST:PORT"),
        (["--metrics", "127.0.0.1:70000"], "--metrics wants HOST:PORT"),
        (["--config", "/nonexistent/broker.properties"], "cannot read config file"),
    ],
)
def test_bad_arguments_get_a_readable_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """In this process: each is refused before a broker starts."""
    try:
        code = main(["broker", "--data-dir", str(tmp_path), *args])
    except SystemExit as usage_error:
        code = int(usage_error.code or 0)
    stderr = capsys.readouterr().err
    assert code == 2
    assert message in stderr
    assert stderr.count("\n") == 1, stderr  # one line, usage errors too


def test_a_misspelled_key_is_one_line_and_a_failed_start() -> None:
    result = _run("broker", "--data-dir", "/nonexistent", "--set", "min.insync.replica=2")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "onceflow: configuration error: unknown broker config min.insync.replica"
        " (did you mean min.insync.replicas?)\n"
    )


def test_an_unknown_flag_is_named_before_a_missing_data_dir() -> None:
    result = _run("broker", "--bogus")
    assert (result.returncode, result.stderr) == (
        2,
        "onceflow broker: unknown option --bogus (see onceflow broker --help)\n",
    )
    missing = _run("broker")  # the control: without the unknown flag, the missing one is named
    assert missing.returncode == 2 and "required: --data-dir" in missing.stderr


def test_a_second_broker_on_the_same_data_dir_is_refused(broker_process: BrokerProcess) -> None:
    result = _run("broker", "--listen", "127.0.0.1:0", "--data-dir", str(broker_process.data_dir))
    assert result.returncode == 2
    assert "already in use by another broker" in result.stderr


def test_a_busy_port_is_reported(broker_process: BrokerProcess, tmp_path: Path) -> None:
    result = _run("broker", "--listen", broker_process.bootstrap_servers, "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "address already in use" in result.stderr.lower()


def test_a_busy_metrics_port_is_reported(broker_process: BrokerProcess, tmp_path: Path) -> None:
    busy = broker_process.bootstrap_servers
    result = _run("broker", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0", "--metrics", busy)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "metrics on" in result.stderr and "address already in use" in result.stderr.lower()


def test_config_file_and_overrides(tmp_path: Path) -> None:
    config = tmp_path / "broker.properties"
    config.write_text("# a comment\nnum.partitions=3\nauto.create.topics.enable = true\n")
    broker = BrokerProcess(tmp_path / "data", settings={"log.segment.bytes": "100000"})
    broker.extra_args = ["--config", str(config)]
    broker.start()
    try:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        metadata = producer.list_topics("auto-created", timeout=10)
        assert len(metadata.topics["auto-created"].partitions) == 3
    finally:
        broker.terminate()


def test_sigterm_is_a_clean_shutdown(broker_process: BrokerProcess) -> None:
    broker_process.terminate()
    assert broker_process.process is not None and broker_process.process.returncode == 0
    checkpoint = (broker_process.data_dir / "recovery-point-offset-checkpoint").read_text()
    assert checkpoint  # written at a clean close, so the next start rescans nothing


def test_an_unreachable_zookeeper_is_one_line_with_kazoos_reason(tmp_path: Path) -> None:
    from onceflow.cluster.zookeeper_server import free_port

    address = f"127.0.0.1:{free_port()}"
    result = _run(
        "broker", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0", "--zookeeper", address,
        "--set", "zookeeper.connection.timeout.ms=1000",
    )  # fmt: skip
    assert result.returncode == 2
    # kazoo warns of each attempt (several a second); they are folded into the one line.
    assert result.stderr.splitlines() == [
        f"onceflow: configuration error: cannot start the broker: cannot reach ZooKeeper at {address}"
        " within 1 s (socket connection error: Connection refused)"
    ]


def test_a_broker_parses_its_arguments_without_the_other_commands() -> None:
    """Brokers start often: the operators' tools, the lab, the pipeline and the fuzzer stay
    unimported (a quarter of a broker's start-up CPU), while `onceflow --help` lists them all."""
    program = (
        "import sys\n"
        "from onceflow.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "others = ('onceflow.admin', 'onceflow.lab', 'onceflow.pipeline', 'onceflow.fuzz', 'onceflow.demo')\n"
        "print(sorted({name.split('.')[1] for name in sys.modules if name.startswith(others)}))\n"
    )

    def imported(*args: str) -> str:
        command = [sys.executable, "-c", program, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.splitlines()[-1]

    assert imported("broker", "--help") == "[]"
    assert imported("--help") == "['admin', 'fuzz', 'lab', 'pipeline']"
