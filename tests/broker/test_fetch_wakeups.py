"""A long-polling fetch is woken by the flushes of the partitions it reads, not by any flush."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from onceflow import EmbeddedBroker
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
