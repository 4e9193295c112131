"""`protocol.fetch_answers` reads a Fetch v12 answer as kio's reader does, its records left as
views into the frame; a frame cut short or padded wrong is refused with a ValueError."""

from __future__ import annotations

import datetime
import io
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer as kio_entity_writer

from onceflow.protocol.codec import MalformedRequestError, decode_response, response_type
from onceflow.protocol.fetch_answers import API_KEY as FETCH
from onceflow.protocol.fetch_answers import VERSION, read_fetch_answer
from tests.protocol.entities import entities

RESPONSE = response_type(FETCH, VERSION)


def _frame(correlation_id: int, response: Any) -> bytes:
    buffer = io.BytesIO()
    kio_entity_writer(RESPONSE.__header_schema__)(
        buffer, RESPONSE.__header_schema__(correlation_id=correlation_id)
    )
    kio_entity_writer(RESPONSE)(buffer, response)
    return buffer.getvalue()


def _as_kio_reads_it(response: Any) -> Any:
    return (
        response.throttle_time // datetime.timedelta(milliseconds=1),
        response.error_code,
        response.session_id,
        [
            (
                topic.topic,
                [
                    (
                        p.partition_index,
                        p.error_code,
                        p.high_watermark,
                        p.last_stable_offset,
                        p.log_start_offset,
                        None
                        if p.aborted_transactions is None
                        else [(a.producer_id, a.first_offset) for a in p.aborted_transactions],
                        p.preferred_read_replica,
                        None if p.records is None else bytes(p.records),
                    )
                    for p in topic.partitions
                ],
            )
            for topic in response.responses
        ],
    )


def _as_we_read_it(answer: Any) -> Any:
    return (
        answer.throttle_time_ms,
        answer.error_code,
        answer.session_id,
        [
            (
                topic.topic,
                [
                    (
                        *p[:5],
                        None if p.aborted_transactions is None else list(p.aborted_transactions),
                        p.preferred_read_replica,
                        None if p.records is None else bytes(p.records),
                    )
                    for p in topic.partitions
                ],
            )
            for topic in answer.responses
        ],
    )


@settings(max_examples=200, deadline=None)
@given(response=entities(RESPONSE), correlation_id=st.integers(-(2**31), 2**31 - 1))
def test_reads_what_kio_reads(response: Any, correlation_id: int) -> None:
    frame = _frame(correlation_id, response)
    kio_id, kio_response = decode_response(FETCH, VERSION, frame)
    our_id, answer = read_fetch_answer(memoryview(frame))
    assert our_id == kio_id == correlation_id
    assert _as_we_read_it(answer) == _as_kio_reads_it(kio_response)


@settings(max_examples=50, deadline=None)
@given(response=entities(RESPONSE))
def test_records_are_views_into_the_frame(response: Any) -> None:
    frame = bytearray(_frame(1, response))
    _, answer = read_fetch_answer(memoryview(frame))
    views = [p.records for t in answer.responses for p in t.partitions if p.records]
    assume(views)  # an answer with records (hypothesis fails the test if it finds too few)
    for view in views:
        assert isinstance(view, memoryview) and view.obj is frame
    read = [bytes(view) for view in views]
    frame[:] = bytes(byte ^ 0xFF for byte in frame)  # the same memory, not a copy: it shows
    assert [bytes(view) for view in views] == [bytes(byte ^ 0xFF for byte in data) for data in read]


@settings(max_examples=100, deadline=None)
@given(response=entities(RESPONSE), data=st.data())
def test_a_frame_cut_short_is_refused(response: Any, data: st.DataObject) -> None:
    frame = _frame(1, response)
    cut = data.draw(st.integers(0, len(frame) - 1), label="cut")
    with pytest.raises(MalformedRequestError):
        read_fetch_answer(memoryview(frame[:cut]))
