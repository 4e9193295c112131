"""`onceflow log check DIR`: every batch of every segment of a data directory read and its CRC
checked, without changing anything, and what does not read listed (after Kafka's
kafka-dump-log --deep-iteration, narrowed to what an operator needs to know)."""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from onceflow.log.scan import CorruptRange, walk_batches
from onceflow.log.segment import INDEX_SUFFIX, LOG_SUFFIX

__all__ = ["Finding", "SegmentsChecked", "check_data_dir"]

_PARTITION_DIR = re.compile(r"(?P<topic>.+)-(?P<partition>\d+)")
_INDEX_ENTRY = struct.Struct(">ii")  # relative offset, position


@dataclass(frozen=True)
class Finding:
    topic: str
    partition: int
    segment: str  # the .log file's name
    corrupt: CorruptRange
    to_the_end: bool  # nothing readable follows it in the segment (a torn tail looks like this)


@dataclass
class SegmentsChecked:
    partitions: int = 0
    segments: int = 0
    batches: int = 0
    bytes: int = 0


def check_data_dir(data_dir: Path, checked: SegmentsChecked) -> Iterator[Finding]:
    """The corrupt stretches of every segment under `data_dir`, partition by partition;
    `checked` counts what was read."""
    for directory in sorted(data_dir.iterdir()):
        match = _PARTITION_DIR.fullmatch(directory.name)
        if not directory.is_dir() or match is None:
            continue
        checked.partitions += 1
        for path in sorted(directory.glob(f"*{LOG_SUFFIX}")):
            if not path.stem.isdigit():
                continue
            checked.segments += 1
            for found in _check_segment(path, checked):
                topic, partition = match["topic"], int(match["partition"])
                yield Finding(topic, partition, path.name, found, found.end_offset is None)


def _indexed_positions(path: Path) -> list[int]:
    """Where the segment's offset index says batches start: places to look for the next intact
    batch after a corrupt one."""
    try:
        data = path.with_suffix(INDEX_SUFFIX).read_bytes()
    except OSError:
        return []
    whole = len(data) - len(data) % _INDEX_ENTRY.size
    return [position for _, position in _INDEX_ENTRY.iter_unpack(data[:whole])]


def _check_segment(path: Path, checked: SegmentsChecked) -> Iterator[CorruptRange]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        checked.bytes += size
        for item in walk_batches(fd, 0, size, int(path.stem), verify=True, hints=_indexed_positions(path)):
            if isinstance(item, CorruptRange):
                yield item
            else:
                checked.batches += 1
    finally:
        os.close(fd)
