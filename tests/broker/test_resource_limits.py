"""Requests that would exhaust the broker's resources are refused with an error, not obeyed."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from onceflow import EmbeddedBroker

OPEN_FILE_LIMIT = 600  # room for (600 - 600 // 4) // 3 = 150 one-segment partitions


def _create(admin: AdminClient, topic: NewTopic) -> None:
    admin.create_topics([topic])[topic.topic].result(timeout=30)


def _error_code(call: object) -> int:
    with pytest.raises(KafkaException) as raised:
        call()  # type: ignore[operator]
    error: KafkaError = raised.value.args[0]
    return error.code()


def test_more_than_ten_thousand_new_partitions_in_one_request_is_a_policy_violation(
    broker: EmbeddedBroker,
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    assert _error_code(lambda: _create(admin, NewTopic("huge", 10_001, 1))) == KafkaError.POLICY_VIOLATION
    _create(admin, NewTopic("grows", 1, 1))
    grow = NewPartitions("grows", 10_002)
    assert (
        _error_code(lambda: admin.create_partitions([grow])["grows"].result(timeout=30))
        == KafkaError.POLICY_VIOLATION
    )
    assert "huge" not in admin.list_topics(timeout=10).topics


@pytest.fixture
def limited_broker(tmp_path: Path) -> Iterator[str]:
    """A broker process whose open-file limit (soft and hard) is low."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILE_LIMIT, OPEN_FILE_LIMIT))

    command = [sys.executable, "-m", "onceflow.cli", "broker", "--listen", "127.0.0.1:0"]
    process = subprocess.Popen(
        [*command, "--data-dir", str(tmp_path / "data")], stdout=subprocess.PIPE, text=True, preexec_fn=limit
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert "listening on" in line, line
    yield line.rsplit(" ", 1)[1].strip()
    process.kill()
    process.wait(timeout=30)


def test_partitions_past_the_open_file_limit_are_refused_and_the_broker_keeps_serving(
    limited_broker: str,
) -> None:
    admin = AdminClient({"bootstrap.servers": limited_broker})
    assert _error_code(lambda: _create(admin, NewTopic("too-many", 200, 1))) == KafkaError.POLICY_VIOLATION
    _create(admin, NewTopic("fits", 40, 1))
    assert _error_code(lambda: _create(admin, NewTopic("no-room", 120, 1))) == KafkaError.POLICY_VIOLATION
    topics = admin.list_topics(timeout=10).topics
    assert "fits" in topics and "too-many" not in topics and "no-room" not in topics
    assert len(topics["fits"].partitions) == 40
