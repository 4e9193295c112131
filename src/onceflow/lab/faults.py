"""Seeded, bounded fault schedules, and the processes the lab kills: the broker and the clients."""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass

FAULTS = (
    "lost-acks",
    "lost-requests",
    "producer-crash",
    "consumer-crash",
    "zombie-consumer",
    "broker-crash",
    "txn-timeout",
)
# Faults that need the lab's own broker: it kills and restarts the broker process.
OWN_BROKER_FAULTS = frozenset({"broker-crash"})

# Lost acks (and lost requests): the share of responses (Produce requests) the proxy destroys while
# the fault is on, and a cap on them.
DROP_PROBABILITY = 0.04
# Answers to writes (acks proper) are lost more often: an at-most-once run has few (only its commits).
DROP_WRITE_PROBABILITY = 0.2
MAX_DROPPED = 25
RESPONSE_DELAY_S = 0.003
# The share of a transactional producer's transactions it aborts on purpose once their records are
# in the log, so that every transactional run has aborted data for read_committed readers to skip.
ABORT_RATE = 0.2
# A producer or worker dies at its next crash point on these (see `workload.CrashPoints`): workers
# alternate between dying before they commit and, where the preset commits first, before output.
CRASH_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
# How long a hanging transaction lives before the broker aborts it.
HANGING_TIMEOUT_MS = 3000  # librdkafka wants socket.timeout.ms (3000) <= this + 100


@dataclass(frozen=True)
class FaultEvent:
    at_s: float
    # kill-producer, kill-consumer, kill-broker, hang-transaction, lose-acks, stop-losing-acks,
    # lose-requests, stop-losing-requests, pause-consumer
    action: str
    target: int = 0
    crash_signal: int = signal.SIGUSR1


def schedule(
    faults: tuple[str, ...], seed: int, window_s: float, producers: int, workers: int
) -> list[FaultEvent]:
    """The fault events of one run, all inside [0, window_s], in time order."""
    rng = random.Random(seed)
    events: list[FaultEvent] = []
    if "lost-acks" in faults:
        events += [FaultEvent(0.3, "lose-acks"), FaultEvent(window_s, "stop-losing-acks")]
    if "lost-requests" in faults:
        events += [FaultEvent(0.3, "lose-requests"), FaultEvent(window_s, "stop-losing-requests")]
    if "producer-crash" in faults:
        events += [
            FaultEvent(rng.uniform(0.5, window_s - 0.5), "kill-producer", rng.randrange(producers))
            for _ in range(3)
        ]
    if "consumer-crash" in faults:
        events += [
            FaultEvent(
                rng.uniform(1.0, window_s - 0.5),
                "kill-consumer",
                rng.randrange(workers),
                CRASH_SIGNALS[kill % 2],
            )
            for kill in range(3)
        ]
    if "zombie-consumer" in faults:
        events.append(FaultEvent(rng.uniform(1.0, window_s - 1.0), "pause-consumer", rng.randrange(workers)))
    if "broker-crash" in faults:
        events.append(FaultEvent(rng.uniform(1.0, window_s - 1.0), "kill-broker"))
    if "txn-timeout" in faults:
        events.append(FaultEvent(rng.uniform(0.5, window_s / 2), "hang-transaction"))
    return sorted(events, key=lambda event: event.at_s)
