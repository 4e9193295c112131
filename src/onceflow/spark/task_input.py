"""Whether a write task got all of its input, or Spark cut it off by closing the worker's socket.

A killed task (a stopped query, a cancelled job) ends on the JVM's side at once, and Spark then
closes its Python worker's socket without killing the worker. If the cut falls between two Arrow
batches, pyarrow reads it as the end of the stream, and the task's `write` would go on to commit
part of its rows; for the exactly-once sink the batch would then count as written, and its rerun
would skip the rest. Input that Spark sent whole is followed on the socket by its end-of-stream
marker, so a worker that finds the socket closed right after its batches was cut off.
"""

from __future__ import annotations

import logging
import select
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from types import FrameType
from typing import Any, BinaryIO

import pyarrow as pa

log = logging.getLogger(__name__)


class InputCutOff(RuntimeError):
    """Spark closed the worker's socket before the end of the task's input."""


def whole_input(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches`, then InputCutOff instead of their end if Spark cut them off."""
    try:
        yield from batches
        worker_input = _worker_input()
        if worker_input is None:
            _warn_unchecked()
            return
        cut_off = _closed_after_the_data(worker_input)
    except ConnectionError as error:  # reset rather than closed: the same, said louder
        raise InputCutOff(f"Spark's connection broke before the end of the task's input: {error}") from error
    if cut_off:
        raise InputCutOff("Spark closed the connection before the end of the task's input: a killed task")


@cache
def _warn_unchecked() -> None:
    log.warning("not in a PySpark worker this check knows: write tasks' input is not checked for a cut")


def _worker_input() -> BinaryIO | None:
    """The stream a PySpark worker reads its task from: `infile` of `pyspark.worker.main`."""
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "main" and _module_name(frame.f_globals) == "pyspark.worker":
            infile = frame.f_locals.get("infile")
            return infile if hasattr(infile, "peek") else None
        frame = frame.f_back
    return None


def _module_name(module_globals: dict[str, Any]) -> Any:
    """A module's name, also when it runs as `python -m` (Spark's workers without its daemon)."""
    name = module_globals.get("__name__")
    spec = module_globals.get("__spec__")
    return spec.name if name == "__main__" and spec is not None else name


def _closed_after_the_data(infile: BinaryIO) -> bool:
    # The socket polls readable when bytes or its end are waiting; if neither is, the JVM is still
    # there. Otherwise peek returns at once: buffered or waiting bytes, or b"" at the end.
    try:
        waiting = bool(_poll_now(infile.fileno()))
    except OSError:
        # No file descriptor to ask (a BufferedRWPair): peek waits for PySpark's end-of-stream
        # marker, which the JVM sends right after the data, or for the end of the socket.
        waiting = True
    return waiting and not infile.peek(1)  # type: ignore[attr-defined]


def _poll_now(fd: int) -> list[tuple[int, int]]:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return poller.poll(0)
