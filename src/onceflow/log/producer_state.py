"""Per-partition producer state: epochs, sequences, duplicate detection and open transactions.

The rules are docs/design.md#idempotent-producer and docs/design.md#transactions (Kafka's
broker behaviour). State is rebuilt on restart from the newest snapshot plus a replay of the
batches appended after it.
"""

from __future__ import annotations

import heapq
import logging
import re
import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from onceflow.log.batch import BatchHeader, next_sequence
from onceflow.log.errors import ProducerStateError
from onceflow.log.files import write_atomically

__all__ = [
    "BatchMetadata",
    "CompletedTransaction",
    "DuplicateBatch",
    "ProducerStateEntry",
    "ProducerStateError",
    "ProducerStateManager",
]

_log = logging.getLogger(__name__)

# Clients keep at most 5 requests in flight, so 5 batches are enough to catch any retry.
RETAINED_BATCHES = 5
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 3

_SNAPSHOT_NAME = re.compile(r"(\d{20})\.snapshot")
# magic, format version, producer count
_SNAPSHOT_HEADER = struct.Struct(">4sHI")
_SNAPSHOT_MAGIC = b"OFPS"
_SNAPSHOT_VERSION = 3
# producer id, epoch, last timestamp, first offset of the open transaction (-1: none), the last
# marker's coordinator epoch (-1: none), batch count; version 2 had no coordinator epoch
_SNAPSHOT_PRODUCER = struct.Struct(">qhqqiB")
_SNAPSHOT_PRODUCER_V2 = struct.Struct(">qhqqB")
# first sequence, last sequence, first offset, last offset, timestamp
_SNAPSHOT_BATCH = struct.Struct(">iiqqq")
_SNAPSHOT_CRC = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int  # the batch's max timestamp


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=RETAINED_BATCHES))
    last_timestamp: int = -1  # broker time of the last append, for expiry
    current_txn_first_offset: int = -1  # first offset of its open transaction here, -1 when none
    # The epoch of the transaction coordinator whose marker last ended one of its transactions
    # here: a marker from an older coordinator (deposed, and late) is refused.
    coordinator_epoch: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find_batch(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None


@dataclass(frozen=True, slots=True)
class CompletedTransaction:
    """A transaction ended by a marker on this partition."""

    producer_id: int
    first_offset: int
    marker_offset: int


@dataclass(frozen=True, slots=True)
class DuplicateBatch:
    """A retried batch that is already in the log: answer with its original offsets."""

    base_offset: int
    last_offset: int
    timestamp: int


class ProducerStateManager:
    def __init__(self) -> None:
        self._producers: dict[int, ProducerStateEntry] = {}
        # The open transactions' first offsets, by producer id, and the same as a min-heap of
        # (first offset, producer id) so every fetch finds the LSO without scanning producers.
        # Ended transactions stay in the heap until they reach its top (or it is rebuilt).
        self._ongoing: dict[int, int] = {}
        self._ongoing_heap: list[tuple[int, int]] = []

    def get(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def entries(self) -> list[ProducerStateEntry]:
        return list(self._producers.values())

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction: the LSO cannot pass it."""
        heap = self._ongoing_heap
        while heap:
            first_offset, producer_id = heap[0]
            if self._ongoing.get(producer_id) == first_offset:
                return first_offset
            heapq.heappop(heap)  # a transaction that has ended since
        return None

    def _begin_transaction(self, entry: ProducerStateEntry, first_offset: int) -> None:
        entry.current_txn_first_offset = first_offset
        self._ongoing[entry.producer_id] = first_offset
        heapq.heappush(self._ongoing_heap, (first_offset, entry.producer_id))

    def _end_transaction(self, entry: ProducerStateEntry) -> int:
        """Forget the producer's open transaction; returns its first offset (-1: none)."""
        first_offset, entry.current_txn_first_offset = entry.current_txn_first_offset, -1
        self._ongoing.pop(entry.producer_id, None)
        if len(self._ongoing_heap) > 2 * len(self._ongoing) + 16:
            # Ended transactions pile up below a long open one: drop them, amortized O(1).
            self._rebuild_ongoing_heap()
        return first_offset

    def _rebuild_ongoing(self) -> None:
        self._ongoing = {
            producer_id: entry.current_txn_first_offset
            for producer_id, entry in self._producers.items()
            if entry.current_txn_first_offset >= 0
        }
        self._rebuild_ongoing_heap()

    def _rebuild_ongoing_heap(self) -> None:
        self._ongoing_heap = [
            (first_offset, producer_id) for producer_id, first_offset in self._ongoing.items()
        ]
        heapq.heapify(self._ongoing_heap)

    def check_and_prepare(self, header: BatchHeader) -> DuplicateBatch | None:
        """Check a batch against the producer's epoch and sequence without changing state.

        Returns the original batch when this one is a duplicate of a retained batch; raises
        ProducerStateError when the batch must be refused.
        """
        if not header.has_producer_id:
            return None
        entry = self._producers.get(header.producer_id)
        if entry is None:
            # Unknown producer (new, or its state expired): any sequence is accepted.
            return None
        epoch = header.producer_epoch
        if epoch < entry.epoch:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"producer {header.producer_id} has epoch {epoch}, older than the current "
                f"epoch {entry.epoch}",
            )
        if header.is_control:
            return None  # markers come from the coordinator and carry no sequence
        if epoch > entry.epoch:
            if header.base_sequence != 0:
                raise ProducerStateError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {header.producer_id} started epoch {epoch} at sequence "
                    f"{header.base_sequence}, expected 0",
                )
            return None
        original = entry.find_batch(header.base_sequence, header.last_sequence)
        if original is not None:
            return DuplicateBatch(original.first_offset, original.last_offset, original.timestamp)
        expected = next_sequence(entry.last_seq)
        if entry.last_seq >= 0 and header.base_sequence != expected:
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {header.producer_id} epoch {epoch} sent sequence "
                f"{header.base_sequence}, expected {expected}",
            )
        return None

    def check_coordinator_epoch(self, producer_id: int, coordinator_epoch: int) -> None:
        """Raise TRANSACTION_COORDINATOR_FENCED for a marker from an older transaction
        coordinator than the one whose marker this producer last had here (Kafka's
        `checkCoordinatorEpoch`): it lost its partition of `__transaction_state`, and its
        marker could end a later transaction of the producer."""
        entry = self._producers.get(producer_id)
        if entry is not None and coordinator_epoch < entry.coordinator_epoch:
            raise ProducerStateError(
                ErrorCode.transaction_coordinator_fenced,
                f"a marker for producer {producer_id} from coordinator epoch {coordinator_epoch}, "
                f"older than {entry.coordinator_epoch}",
            )

    def update(
        self, header: BatchHeader, base_offset: int, now_ms: int, coordinator_epoch: int = -1
    ) -> CompletedTransaction | None:
        """Record a batch that was just appended (or replayed) at `base_offset`; a marker
        (with the epoch of the coordinator that wrote it) returns the transaction it ended."""
        if not header.has_producer_id:
            return None
        entry = self._producers.get(header.producer_id)
        if entry is None or entry.epoch != header.producer_epoch:
            # A new epoch starts a new sequence space: older batches can no longer match.
            open_txn = entry.current_txn_first_offset if entry is not None else -1
            entry = ProducerStateEntry(
                header.producer_id,
                header.producer_epoch,
                current_txn_first_offset=open_txn,
                coordinator_epoch=entry.coordinator_epoch if entry is not None else -1,
            )
            self._producers[header.producer_id] = entry
        entry.last_timestamp = now_ms
        if header.is_control:
            entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
            first_offset = self._end_transaction(entry)
            return (
                CompletedTransaction(header.producer_id, first_offset, base_offset)
                if first_offset >= 0
                else None
            )
        if header.is_transactional and entry.current_txn_first_offset < 0:
            self._begin_transaction(entry, base_offset)
        entry.batches.append(
            BatchMetadata(
                header.base_sequence,
                header.last_sequence,
                base_offset,
                base_offset + header.last_offset_delta,
                header.max_timestamp,
            )
        )
        return None

    def endings(
        self, headers: list[BatchHeader], base_offsets: list[int]
    ) -> list[tuple[int, CompletedTransaction, int | None]]:
        """What appending `headers` at `base_offsets` would end, without changing any state: for
        each marker that ends an open transaction, its index, the transaction, and the first
        unstable offset right after it (as `update` would leave them, batch by batch)."""
        ongoing = dict(self._ongoing)
        ended = []
        for index, (header, base_offset) in enumerate(zip(headers, base_offsets, strict=True)):
            if not header.has_producer_id:
                continue
            if header.is_control:
                first_offset = ongoing.pop(header.producer_id, None)
                if first_offset is not None:
                    completed = CompletedTransaction(header.producer_id, first_offset, base_offset)
                    ended.append((index, completed, min(ongoing.values(), default=None)))
            elif header.is_transactional and header.producer_id not in ongoing:
                ongoing[header.producer_id] = base_offset
        return ended

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for at least `expiration_ms`, except those with an open
        transaction (the coordinator's timeout ends those); returns how many."""
        expired = [
            producer_id
            for producer_id, entry in self._producers.items()
            if now_ms - entry.last_timestamp >= expiration_ms and entry.current_txn_first_offset < 0
        ]
        for producer_id in expired:
            del self._producers[producer_id]
        return len(expired)

    # -- snapshots ----------------------------------------------------------------------------

    def take_snapshot(self, directory: Path, offset: int) -> None:
        """Write the state as of `offset` (every batch below it applied), then keep only the
        newest few snapshots."""
        write_snapshot(directory, offset, self.encode_snapshot())

    def encode_snapshot(self) -> bytes:
        parts = [_SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, len(self._producers))]
        for entry in self._producers.values():
            parts.append(
                _SNAPSHOT_PRODUCER.pack(
                    entry.producer_id,
                    entry.epoch,
                    entry.last_timestamp,
                    entry.current_txn_first_offset,
                    entry.coordinator_epoch,
                    len(entry.batches),
                )
            )
            parts.extend(
                _SNAPSHOT_BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp)
                for b in entry.batches
            )
        body = b"".join(parts)
        return body + _SNAPSHOT_CRC.pack(crc32c(body))

    def load_latest_snapshot(self, directory: Path, max_offset: int) -> int:
        """Replace the state with the newest readable snapshot at or below `max_offset` and
        return its offset (0 when there is none). Snapshots above `max_offset` describe data
        that no longer exists and are deleted, as are unreadable ones."""
        self._producers = {}
        self._rebuild_ongoing()
        for leftover in directory.glob(f"*{SNAPSHOT_SUFFIX}.tmp"):
            leftover.unlink(missing_ok=True)
        for path in reversed(list_snapshots(directory)):
            offset = snapshot_offset(path)
            if offset > max_offset:
                path.unlink()
                continue
            try:
                self._producers = _decode_snapshot(path.read_bytes())
            except ValueError as exc:
                _log.warning("%s: ignoring unreadable producer snapshot: %s", path, exc)
                path.unlink()
                continue
            self._rebuild_ongoing()
            return offset
        return 0


def write_snapshot(directory: Path, offset: int, data: bytes) -> None:
    """Write an encoded snapshot atomically, then keep only the newest few."""
    write_atomically(snapshot_path(directory, offset), data)
    for stale in list_snapshots(directory)[:-SNAPSHOTS_KEPT]:
        stale.unlink(missing_ok=True)


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offset(path: Path) -> int:
    return int(path.name[: -len(SNAPSHOT_SUFFIX)])


def list_snapshots(directory: Path) -> list[Path]:
    """Snapshot files, oldest first."""
    return sorted(
        (path for path in directory.iterdir() if _SNAPSHOT_NAME.fullmatch(path.name)),
        key=snapshot_offset,
    )


def _decode_snapshot(data: bytes) -> dict[int, ProducerStateEntry]:
    if len(data) < _SNAPSHOT_HEADER.size + _SNAPSHOT_CRC.size:
        raise ValueError("file too short")
    body, (crc,) = data[: -_SNAPSHOT_CRC.size], _SNAPSHOT_CRC.unpack_from(data, len(data) - 4)
    if crc32c(body) != crc:
        raise ValueError("CRC mismatch")
    magic, version, count = _SNAPSHOT_HEADER.unpack_from(body)
    if magic != _SNAPSHOT_MAGIC or version not in (2, _SNAPSHOT_VERSION):
        raise ValueError(f"unknown format {magic!r} version {version}")
    producers: dict[int, ProducerStateEntry] = {}
    pos = _SNAPSHOT_HEADER.size
    try:
        for _ in range(count):
            coordinator_epoch = -1
            if version == 2:
                fields = _SNAPSHOT_PRODUCER_V2.unpack_from(body, pos)
                pos += _SNAPSHOT_PRODUCER_V2.size
                producer_id, epoch, last_timestamp, txn_first_offset, batch_count = fields
            else:
                fields = _SNAPSHOT_PRODUCER.unpack_from(body, pos)
                pos += _SNAPSHOT_PRODUCER.size
                producer_id, epoch, last_timestamp, txn_first_offset, coordinator_epoch, batch_count = fields
            entry = ProducerStateEntry(
                producer_id,
                epoch,
                last_timestamp=last_timestamp,
                current_txn_first_offset=txn_first_offset,
                coordinator_epoch=coordinator_epoch,
            )
            for _ in range(batch_count):
                entry.batches.append(BatchMetadata(*_SNAPSHOT_BATCH.unpack_from(body, pos)))
                pos += _SNAPSHOT_BATCH.size
            producers[producer_id] = entry
    except struct.error:
        raise ValueError("truncated producer entries") from None
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} unexpected trailing bytes")
    return producers
