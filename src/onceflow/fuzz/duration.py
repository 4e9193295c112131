"""How long a fuzzing campaign runs: its seconds, and on past them while a loaded machine has let
it send too few frames to have tested much (up to `LONGEST_RUN` times as long)."""

from __future__ import annotations

LONGEST_RUN = 10  # times `seconds`, however few frames were sent by then


def runs_on(elapsed_s: float, seconds: float, sent: int, min_sent: int) -> bool:
    return elapsed_s < seconds or (sent < min_sent and elapsed_s < LONGEST_RUN * seconds)
