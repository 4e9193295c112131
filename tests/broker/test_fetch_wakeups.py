"""A long-polling fetch is woken by the flushes of the partitions it reads, not by any flush, and
not left waiting by one that ended before it began to wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from onceflow import EmbeddedBroker
from onceflow.apis import fetch
from onceflow.log.batch import validate_batches
from tests.conftest import wait_until
from tests.wire import WireClient, make_batch, produce


def _long_poll(client: WireClient, topic: str) -> Any:
    return client.fetch({topic: [0]}, max_wait=20_000, min_bytes=1)


def test_flushes_of_other_partitions_do_not_wake_a_waiting_fetch(tmp_path: Path, reads: list[int]) -> None:
    with EmbeddedBroker(tmp_path) as broker, WireClient(broker.bootstrap_servers, timeout_s=30) as waiting:
        with WireClient(broker.bootstrap_servers) as producing:
            producing.create_topic("quiet", 1)
            producing.create_topic("busy", 1)
            answers: list[Any] = []
            poll = threading.Thread(target=lambda: answers.append(_long_poll(waiting, "quiet")))
            poll.start()
            wait_until(lambda: reads == [0], timeout_s=10)  # the fetch waits on "quiet"
            for index in range(5):  # each acks=all produce is answered after its flush
                assert produce(producing, "busy", 0, make_batch([b"x"]), acks=-1).error_code == 0
                assert reads == [0], f"a flush of another partition woke the fetch (produce {index})"
            assert produce(producing, "quiet", 0, make_batch([b"wanted"]), acks=-1).error_code == 0
            poll.join(timeout=15)
    assert len(answers) == 1
    assert answers[0].responses[0].partitions[0].records
    assert reads[0] == 0 and reads[1] > 0 and len(reads) == 2


def test_a_flush_between_the_read_and_the_wait_ends_the_wait_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The handler reads, then its long poll starts a turn of the event loop later; a flush that
    # ends in between wakes nobody. Here the long poll, before it starts, appends and flushes
    # behind the broker's back: the fetch must see that without waiting its 20 s.
    original = fetch._long_poll
    flushed_behind: list[int] = []

    async def flush_then_long_poll(request: Any, *args: Any) -> Any:
        log = request.broker.logs.get("quiet", 0)
        batch = make_batch([b"late"])
        log.append(batch, validate_batches(batch), int(time.time() * 1000))
        flushed_behind.append(log.flush())
        return await original(request, *args)

    monkeypatch.setattr(fetch, "_long_poll", flush_then_long_poll)
    with EmbeddedBroker(tmp_path) as broker, WireClient(broker.bootstrap_servers, timeout_s=30) as client:
        client.create_topic("quiet", 1)
        started = time.monotonic()
        answer = _long_poll(client, "quiet")
        waited = time.monotonic() - started
    assert flushed_behind == [1]
    assert answer.responses[0].partitions[0].records
    assert waited < 5, f"the fetch waited {waited:.1f} s for a flush that had already ended"


@pytest.mark.parametrize(
    ("partitions", "offset", "error"),
    [
        ({"t": [0]}, 1000, ErrorCode.offset_out_of_range),
        ({"t": [5]}, 0, ErrorCode.unknown_topic_or_partition),
        ({"never-created": [0]}, 0, ErrorCode.unknown_topic_or_partition),
    ],
)
def test_a_partition_error_is_answered_at_once_not_after_the_long_poll(
    partitions: dict[str, list[int]], offset: int, error: ErrorCode
) -> None:
    # As Kafka's: a consumer whose offset is out of range resets at once, not after its max wait.
    with EmbeddedBroker() as broker, WireClient(broker.bootstrap_servers, timeout_s=30) as client:
        client.create_topic("t", 1)
        assert produce(client, "t", 0, make_batch([b"x"]), acks=-1).error_code == 0
        started = time.monotonic()
        answer = client.fetch(partitions, max_wait=20_000, min_bytes=1, fetch_offset=offset)
        waited = time.monotonic() - started
    assert answer.responses[0].partitions[0].error_code == error
    assert waited < 5, f"answered after {waited:.1f} s of a 20 s long poll"
