from __future__ import annotations

from pathlib import Path
from typing import Any

from onceflow.log.batch import BatchHeader, validate_batches
from onceflow.log.config import LogConfig
from onceflow.log.loader import Shutdown
from onceflow.log.log import AppendResult, PartitionLog


def open_log(
    directory: Path,
    recovery_point: int = 0,
    now_ms: int = 0,
    shutdown: Shutdown = Shutdown.REBOOT,
    **config: Any,
) -> PartitionLog:
    return PartitionLog.open(directory, LogConfig(**config), recovery_point, now_ms, shutdown)


def append(log: PartitionLog, batch: bytearray, now_ms: int = 0) -> AppendResult:
    return log.append(batch, validate_batches(batch), now_ms)


def read_all(log: PartitionLog, start: int | None = None, max_bytes: int = 700) -> list[BatchHeader]:
    """Every batch from `start`, fetch by fetch, CRC-checked."""
    offset = log.log_start_offset if start is None else start
    headers: list[BatchHeader] = []
    while data := log.read(offset, max_bytes):
        batch_headers = validate_batches(data)
        headers += batch_headers
        offset = batch_headers[-1].last_offset + 1
    return headers


def segment_files(directory: Path, suffix: str = ".log") -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))
