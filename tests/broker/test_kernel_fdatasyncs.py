"""fdatasync through Linux AIO, as the broker's flushes run it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from onceflow.broker.kernel_fdatasyncs import MAX_IN_FLIGHT, KernelFdatasyncs


def test_many_syncs_at_once_all_end_and_a_failed_one_raises_oserror(tmp_path: Path) -> None:
    async def run() -> None:
        kernel = KernelFdatasyncs.open()
        assert kernel is not None, "Linux AIO is missing on this machine: the broker uses threads"
        fds = [os.open(tmp_path / f"{index}.log", os.O_WRONLY | os.O_CREAT) for index in range(3)]
        try:
            for fd in fds:
                os.write(fd, b"x" * 4096)
            # More than fit in flight at once: the rest wait for a slot.
            await asyncio.wait_for(
                asyncio.gather(*(kernel.fdatasync(fds[index % 3]) for index in range(2 * MAX_IN_FLIGHT))), 30
            )
            closed = os.open(tmp_path / "closed.log", os.O_WRONLY | os.O_CREAT)
            os.close(closed)
            with pytest.raises(OSError):
                await asyncio.wait_for(kernel.fdatasync(closed), 30)
        finally:
            for fd in fds:
                os.close(fd)
            kernel.close()

    asyncio.run(run())
