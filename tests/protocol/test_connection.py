"""The sans-I/O connection: framing under any chunking, and the errors it raises."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.protocol.connection import (
    Connection,
    ProtocolError,
    RequestReceived,
    UnsupportedApiVersionsRequest,
)
from tests.wire import WireClient, make_batch


def _frames() -> list[bytes]:
    client = WireClient.__new__(WireClient)
    client._correlation_id = 0
    metadata = client.frame(
        3, 12, topics=None, allow_auto_topic_creation=True, include_topic_authorized_operations=False
    )[1]
    versions = client.frame(18, 3, client_software_name="t", client_software_version="1")[1]
    old_versions = client.frame(18, 0)[1]
    return [metadata, versions, old_versions]


FRAMES = _frames()


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=50))
def test_any_chunking_yields_the_same_requests(cuts: list[int]) -> None:
    stream = b"".join(FRAMES)
    connection = Connection(max_request_bytes=1 << 20)
    events = []
    position = 0
    for cut in cuts:
        events += connection.receive_data(stream[position : position + cut])
        position += cut
    events += connection.receive_data(stream[position:])
    assert [
        (e.api_key, e.api_version, e.correlation_id) for e in events if isinstance(e, RequestReceived)
    ] == [(3, 12, 1), (18, 3, 2), (18, 0, 3)]


@pytest.mark.parametrize("size", [-1, 0, 7, (1 << 20) + 1])
def test_absurd_lengths_are_protocol_errors(size: int) -> None:
    with pytest.raises(ProtocolError):
        Connection(max_request_bytes=1 << 20).receive_data(struct.pack(">i", size) + b"\0" * 16)


def test_unknown_api_key_is_a_protocol_error() -> None:
    frame = struct.pack(">hhi", 999, 0, 7) + b"\0\0"
    with pytest.raises(ProtocolError):
        Connection(1 << 20).receive_data(struct.pack(">i", len(frame)) + frame)


def test_api_versions_from_the_future_gets_the_v0_fallback() -> None:
    frame = struct.pack(">hhi", 18, 99, 7) + b"\xff\xff"
    events = Connection(1 << 20).receive_data(struct.pack(">i", len(frame)) + frame)
    assert events == [UnsupportedApiVersionsRequest(correlation_id=7)]


@given(st.binary(min_size=0, max_size=64))
def test_truncated_bodies_never_escape_as_other_errors(tail: bytes) -> None:
    frame = FRAMES[0][4:12] + tail  # a Metadata header cut short and followed by junk
    with contextlib.suppress(ProtocolError):
        Connection(1 << 20).receive_data(struct.pack(">i", len(frame)) + frame)


def _produce_frame(correlation_id: int, records: bytes) -> bytes:
    client = WireClient.__new__(WireClient)
    client._correlation_id = correlation_id - 1
    topic_data = [{"name": "t", "partition_data": [{"index": 0, "records": records}]}]
    return client.frame(0, 9, transactional_id=None, acks=-1, timeout=1000, topic_data=topic_data)[1]


@given(
    st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=3), min_size=1, max_size=6),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_any_chunking_of_produce_frames_yields_the_same_payloads(
    batches: list[list[bytes]], cuts: list[int], chunk_type: type[bytes | bytearray | memoryview]
) -> None:
    payloads = [make_batch(values) for values in batches]
    frames = [_produce_frame(index + 1, records) for index, records in enumerate(payloads)]
    stream = b"".join(frames)
    expected = [Connection(1 << 20).receive_data(frame)[0] for frame in frames]
    connection = Connection(max_request_bytes=1 << 20)
    events = []
    position = 0
    for cut in [*sorted(cuts), len(stream)]:
        events += connection.receive_data(chunk_type(stream[position : max(cut, position)]))
        position = max(cut, position)
    assert events == expected
    assert [
        e.body.topic_data[0].partition_data[0].records for e in events if isinstance(e, RequestReceived)
    ] == payloads


@given(
    st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=3), min_size=1, max_size=6),
    st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=30),
    st.integers(min_value=8, max_value=1200),
)
def test_reads_into_its_buffers_yield_the_same_requests(
    batches: list[list[bytes]], read_sizes: list[int], read_buffer_bytes: int
) -> None:
    """As the server reads: into `get_buffer()`, as much as a read brings. With a small read
    buffer, most frames are larger than it and take the way through a buffer of their own."""
    payloads = [make_batch(values) for values in batches]
    frames = [_produce_frame(index + 1, records) for index, records in enumerate(payloads)]
    stream = memoryview(b"".join(frames))
    connection = Connection(1 << 20, read_buffer_bytes=read_buffer_bytes)
    events = []
    position = 0
    reads = iter(read_sizes * (len(stream) // len(read_sizes) + 1))
    while position < len(stream):
        buffer = connection.get_buffer()
        assert len(buffer) > 0
        count = min(len(buffer), next(reads), len(stream) - position)
        buffer[:count] = stream[position : position + count]
        events += connection.buffer_updated(count)
        position += count
    assert events == [Connection(1 << 20).receive_data(frame)[0] for frame in frames]
    assert connection.get_buffer().nbytes == read_buffer_bytes  # nothing left over


@pytest.mark.parametrize("header_bytes_read", [1, 2, 3])
def test_a_frame_header_cut_at_the_read_buffers_end_is_read_whole(header_bytes_read: int) -> None:
    first, second = FRAMES[0], FRAMES[1]
    connection = Connection(1 << 20, read_buffer_bytes=len(first) + header_bytes_read)
    connection.get_buffer()[:] = (first + second)[: len(first) + header_bytes_read]
    assert len(connection.buffer_updated(len(first) + header_bytes_read)) == 1
    rest = second[header_bytes_read:]
    buffer = connection.get_buffer()
    assert len(buffer) >= len(rest)
    buffer[: len(rest)] = rest
    assert [event.correlation_id for event in connection.buffer_updated(len(rest))] == [2]


def _lazy_free_bytes() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("LazyFree:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no LazyFree")


def test_a_large_frames_buffer_is_given_back_once_decoded() -> None:
    """The buffer a large frame was read into is kept for the next one, its pages marked free
    (MADV_FREE): the kernel takes them back when it needs memory, so idle connections hold none,
    and a connection that goes on sending large frames writes over them at no cost."""
    frame = _produce_frame(1, make_batch([bytes(1 << 20)] * 8))
    connection = Connection(100 << 20)
    before = _lazy_free_bytes()
    position = 0
    while position < len(frame):
        buffer = connection.get_buffer()
        count = min(len(buffer), 256 << 10, len(frame) - position)
        buffer[:count] = frame[position : position + count]
        del buffer
        events = connection.buffer_updated(count)
        position += count
    assert len(events) == 1
    assert _lazy_free_bytes() - before > 7 << 20  # ~0 when the pages stay the buffer's (the control)
