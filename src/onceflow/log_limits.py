"""Log lines that a fault repeats many times a second (a full disk, no descriptors left): once per
interval each, the next one saying how many were held back."""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["OncePerInterval", "once_per_interval"]

INTERVAL_S = 10.0


class OncePerInterval(logging.Filter):
    """Lets each message (told apart by its logger, its format string and its first argument,
    which names what it is about) through once per `interval_s`."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._seen: dict[tuple[str, str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()  # background threads log too

    def filter(self, record: logging.LogRecord) -> bool:
        about = record.args[0] if isinstance(record.args, tuple) and record.args else None
        key = (record.name, str(record.msg), str(about))
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(key, (float("-inf"), 0))
            if now - last < self._interval_s:
                self._seen[key] = (last, held + 1)
                return False
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the last {self._interval_s:g} s)"
        return True


def once_per_interval(name: str, interval_s: float = INTERVAL_S) -> logging.Logger:
    """A logger (a child of `name`) whose lines come at most once per interval each."""
    logger = logging.getLogger(f"{name}.repeated")
    if not any(isinstance(existing, OncePerInterval) for existing in logger.filters):
        logger.addFilter(OncePerInterval(interval_s))
    return logger
