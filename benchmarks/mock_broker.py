"""Host librdkafka's mock cluster in a process of its own, as a reference broker.

The mock cluster lives inside whichever client creates it; this idle producer creates it and
keeps it alive until SIGTERM, so load clients in other processes reach it over TCP exactly as
they reach the onceflow broker.
"""

from __future__ import annotations

import signal
import sys
import threading

from confluent_kafka import Producer


def main() -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    host = Producer({"test.mock.num.brokers": 1})
    brokers = host.list_topics(timeout=10).brokers
    address = next(iter(brokers.values()))
    print(f"mock cluster listening on {address.host}:{address.port}", flush=True)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
