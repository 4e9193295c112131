"""A follower's reading of Fetch v12 answers that leaves their records where they are.

kio's native reader copies every `records` field into a bytes object of its own. A follower's
answers are mostly records, a megabyte per partition under load, and that copy into memory
just allocated cost about a twentieth of a 3-broker cluster's CPU per acknowledged MB. Here each
partition's records are a view into the answer's frame: valid until the frame's buffer takes the
next answer, so the follower appends them before it sends its next fetch (`Link.fetch`). Every
other field reads as kio's reader reads it (tests/protocol/test_fetch_answers.py compares the two
on generated answers); the tagged fields, which a follower does not use, are skipped.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from onceflow.protocol.codec import MalformedRequestError

API_KEY = 1
VERSION = 12

_INT32 = struct.Struct(">i")
_BODY_START = struct.Struct(">ihi")  # throttle time, error code, session id
_PARTITION_START = struct.Struct(">ihqqq")  # index, error code, high watermark, LSO, log start
_ABORTED = struct.Struct(">qq")  # producer id, first offset


class PartitionAnswer(NamedTuple):
    partition_index: int
    error_code: ErrorCode
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[tuple[int, int], ...] | None  # (producer id, first offset)
    preferred_read_replica: int
    records: memoryview | None


class TopicAnswer(NamedTuple):
    topic: str
    partitions: tuple[PartitionAnswer, ...]


class FetchAnswer(NamedTuple):
    throttle_time_ms: int
    error_code: ErrorCode
    session_id: int
    responses: tuple[TopicAnswer, ...]


def read_fetch_answer(frame: memoryview) -> tuple[int, FetchAnswer]:
    """The correlation id and body of a Fetch v12 answer (`frame` without its length prefix).
    Raises MalformedRequestError, a ValueError, when the frame does not hold one."""
    try:
        return _Reader(frame).answer()
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as error:
        raise MalformedRequestError(f"cannot read a Fetch v{VERSION} answer: {error}") from error


class _Reader:
    def __init__(self, frame: memoryview) -> None:
        self.frame = frame
        self.at = 0

    def answer(self) -> tuple[int, FetchAnswer]:
        (correlation_id,) = self.fixed(_INT32)
        self.skip_tagged_fields()  # the response header's (v1)
        throttle_time_ms, error_code, session_id = self.fixed(_BODY_START)
        responses = tuple(self.topic() for _ in range(self.array_length()))
        self.skip_tagged_fields()
        return correlation_id, FetchAnswer(throttle_time_ms, ErrorCode(error_code), session_id, responses)

    def topic(self) -> TopicAnswer:
        name = self.piece(self.uvarint() - 1)
        partitions = tuple(self.partition() for _ in range(self.array_length()))
        self.skip_tagged_fields()
        return TopicAnswer(str(name, "utf-8"), partitions)

    def partition(self) -> PartitionAnswer:
        index, error_code, high_watermark, last_stable_offset, log_start_offset = self.fixed(_PARTITION_START)
        count = self.uvarint() - 1
        aborted = None if count < 0 else tuple(self.aborted() for _ in range(count))
        (preferred_read_replica,) = self.fixed(_INT32)
        size = self.uvarint() - 1
        records = None if size < 0 else self.piece(size)
        self.skip_tagged_fields()
        return PartitionAnswer(
            index,
            ErrorCode(error_code),
            high_watermark,
            last_stable_offset,
            log_start_offset,
            aborted,
            preferred_read_replica,
            records,
        )

    def aborted(self) -> tuple[int, int]:
        producer_id, first_offset = self.fixed(_ABORTED)
        self.skip_tagged_fields()
        return producer_id, first_offset

    def fixed(self, layout: struct.Struct) -> tuple[int, ...]:
        values = layout.unpack_from(self.frame, self.at)
        self.at += layout.size
        return values

    def piece(self, size: int) -> memoryview:
        if size < 0 or self.at + size > len(self.frame):
            raise ValueError(f"{size} bytes at byte {self.at} run past the frame's {len(self.frame)}")
        piece = self.frame[self.at : self.at + size]
        self.at += size
        return piece

    def array_length(self) -> int:
        count = self.uvarint() - 1
        if count < 0:
            raise ValueError(f"a null array at byte {self.at}")
        return count

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.frame[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError(f"an unsigned varint longer than 5 bytes at byte {self.at}")

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # the tag
            self.piece(self.uvarint())
