"""`onceflow produce` and `onceflow consume` as a script runs them: standard input and output,
and exit codes to act on. The interface itself runs as a process; the rest runs the same `main`
in this process, which starts in a fraction of the time."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from onceflow import EmbeddedBroker
from onceflow.cli import main
from tests.conftest import FAST_JOINS

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tmp_path_factory.mktemp("console") / "data", config=FAST_JOINS) as running:
        yield running


class Ran(NamedTuple):
    code: int
    stdout: str
    stderr: str


class _Stdout(io.StringIO):
    """A text stdout whose `buffer` (where consume writes) lands in the same text."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = io.BytesIO()

    def text(self) -> str:
        return self.getvalue() + self.buffer.getvalue().decode()


def cli(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, *args: str, stdin: str = "") -> Ran:
    """`onceflow ARGS --bootstrap BROKER` in this process."""
    out, err = _Stdout(), io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    try:
        code = main([*args, "--bootstrap", broker.bootstrap_servers])
    except SystemExit as exit:  # argparse's usage errors
        code = int(exit.code or 0)
    return Ran(code, out.text(), err.getvalue())


def test_the_interface_a_script_uses(broker: EmbeddedBroker) -> None:
    """`produce TOPIC --bootstrap` reads a value a line; `consume TOPIC --bootstrap
    --from-beginning -n N` prints one a line and exits after N."""
    command = [sys.executable, "-m", "onceflow.cli"]
    address = ["--bootstrap", broker.bootstrap_servers]
    produced = subprocess.run(
        [*command, "produce", "lines", *address], input="one\ntwo\n\nthree\n", capture_output=True, text=True
    )
    assert (produced.returncode, produced.stdout, produced.stderr) == (0, "", "")
    consumed = subprocess.run(
        [*command, "consume", "lines", *address, "--from-beginning", "-n", "4"],
        capture_output=True,
        text=True,
    )
    assert (consumed.returncode, consumed.stdout, consumed.stderr) == (0, "one\ntwo\n\nthree\n", "")


def test_starting_points_and_the_timeout(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli(broker, monkeypatch, "produce", "points", stdin="a\nb\nc\n").code == 0
    # From the end, as Kafka's tool starts: nothing comes, and the timeout says so (exit 3).
    assert cli(broker, monkeypatch, "consume", "points", "--timeout", "0.5") == Ran(
        3, "", "onceflow consume: no record for 0.5 s (0 printed)\n"
    )
    assert cli(broker, monkeypatch, "consume", "points", "--offset", "-2", "--exit-at-end").stdout == "b\nc\n"
    assert cli(broker, monkeypatch, "consume", "points", "--offset", "1", "-n", "1").stdout == "b\n"


def test_keys_headers_partitions_timestamps_and_json(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli(broker, monkeypatch, "topics", "create", "shaped", "--partitions", "2").code == 0
    keyed = cli(
        broker, monkeypatch, "produce", "shaped", "--key-separator", ":", "--header", "source=test",
        "--partition", "1", stdin="k1:v1\nk2:v:2\n",
    )  # fmt: skip
    assert keyed.code == 0, keyed.stderr
    as_json = [
        {"key": "k3", "value": "v3", "headers": {"h": "x"}, "partition": 0, "timestamp": 1_700_000_000_000},
        {"value": "v4", "partition": 0, "timestamp": 1_700_000_005_000},
    ]
    stdin = "".join(json.dumps(record) + "\n" for record in as_json)
    assert cli(broker, monkeypatch, "produce", "shaped", "--format", "json", stdin=stdin).code == 0

    one = ["consume", "shaped", "--partition", "1", "--from-beginning", "-n", "2", "--print-key"]
    assert cli(broker, monkeypatch, *one).stdout == "k1\tv1\nk2\tv:2\n"
    zero = ["consume", "shaped", "--partition", "0", "--from-beginning", "--exit-at-end", "--format", "json"]
    first, second = (json.loads(line) for line in cli(broker, monkeypatch, *zero).stdout.splitlines())
    assert first == {
        "topic": "shaped", "partition": 0, "offset": 0, "timestamp": 1_700_000_000_000,
        "key": "k3", "value": "v3", "headers": [["h", "x"]],
    }  # fmt: skip
    assert (second["key"], second["value"], second["headers"]) == (None, "v4", [])
    later = ["consume", "shaped", "--partition", "0", "--timestamp", "1700000001000", "-n", "1"]
    assert cli(broker, monkeypatch, *later).stdout == "v4\n"


def test_transactions_are_all_or_nothing_for_read_committed_readers(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Transactions of two records; a bad line in the second aborts it, and the command says why.
    failed = cli(
        broker, monkeypatch, "produce", "ledger", "--transactional-id", "loader", "--transaction-size", "2",
        "--key-separator", ":", stdin="k:a\nk:b\nk:c\nno separator\nk:d\n",
    )  # fmt: skip
    assert failed == Ran(2, "", "onceflow produce: line 4 has no key separator ':'\n")
    reader = ["consume", "ledger", "--from-beginning", "--exit-at-end", "--isolation-level", "read_committed"]
    assert cli(broker, monkeypatch, *reader).stdout == "a\nb\n"
    # The control: without a transaction, what came before the bad line is written.
    plain = cli(broker, monkeypatch, "produce", "ledger", "--key-separator", ":", stdin="k:e\nno separator\n")
    assert plain.code == 2
    assert cli(broker, monkeypatch, *reader).stdout == "a\nb\ne\n"


def test_a_group_resumes_where_it_left_off(broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli(broker, monkeypatch, "produce", "queue", stdin="1\n2\n3\n").code == 0
    first = cli(broker, monkeypatch, "consume", "queue", "--group", "workers", "--from-beginning", "-n", "2")
    second = cli(broker, monkeypatch, "consume", "queue", "--group", "workers", "-n", "1")
    assert (first.stdout, second.stdout) == ("1\n2\n", "3\n")


def test_errors_are_one_line_with_an_exit_code_to_act_on(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    unknown = cli(broker, monkeypatch, "consume", "no-such-topic", "--from-beginning", "-n", "1")
    assert unknown == Ran(1, "", "onceflow consume: unknown topic 'no-such-topic'\n")
    mixed = cli(broker, monkeypatch, "consume", "points", "--group", "g", "--partition", "0")
    assert mixed.code == 2 and mixed.stderr.count("\n") == 1
    config = tmp_path / "client.properties"
    config.write_text("# as Kafka's tools take it\nclient.id=console-test\n")
    with_config = cli(
        broker, monkeypatch, "produce", "configured", "--command-config", str(config), stdin="x\n"
    )
    assert with_config.code == 0, with_config.stderr
    config.write_text("no.such.property=1\n")
    refused = cli(broker, monkeypatch, "produce", "configured", "--command-config", str(config), stdin="x\n")
    assert refused.code == 1 and refused.stderr.startswith("onceflow produce: cannot configure the producer")
    missing = cli(broker, monkeypatch, "consume", "points", "--command-config", str(tmp_path / "missing"))
    assert missing.code == 2 and "cannot read config file" in missing.stderr
