"""Small durable-file helpers shared by the storage modules."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_IOV_MAX = os.sysconf("SC_IOV_MAX")
# What a step can run out of before it syncs anything: descriptors, and space for a new file.
_OUT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT})


class SyncNotStarted(OSError):
    """A sync could not begin: no descriptor to open what it syncs, or no space to write the new
    file it would sync. No fsync ran, so no page was marked clean: unlike after a failed fsync,
    the same sync can be tried again."""


@contextmanager
def _before_any_sync() -> Iterator[None]:
    try:
        yield
    except OSError as error:
        if error.errno in _OUT_OF:
            raise SyncNotStarted(error.errno, error.strerror, error.filename) from error
        raise


def write_fully(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """pwrite can write less than asked (a full disk, a signal), so loop until done."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def write_fully_vectored(fd: int, pieces: list[bytes | bytearray | memoryview], position: int) -> None:
    """`write_fully` of the pieces one after another, with one pwritev per IOV_MAX pieces."""
    while pieces:
        written = os.pwritev(fd, pieces[:_IOV_MAX], position)
        position += written
        done = 0
        while done < len(pieces) and written >= len(pieces[done]):
            written -= len(pieces[done])
            done += 1
        pieces = pieces[done:]
        if written:
            pieces[0] = memoryview(pieces[0])[written:]


def fsync_directory(path: Path) -> None:
    """Make created, renamed or removed directory entries survive a power loss."""
    with _before_any_sync():
        fd = os.open(path, _DIRECTORY_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` so that a crash leaves either the old or the new content."""
    tmp = path.with_name(path.name + ".tmp")
    with _before_any_sync():
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with _before_any_sync():  # `path` is untouched, and `tmp` is written anew next time
            write_fully(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)
