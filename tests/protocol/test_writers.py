"""`protocol.writers` writes exactly kio's bytes, for every request and response (and their
headers) of every version the broker supports, with Hypothesis-drawn values."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer as kio_entity_writer

from onceflow.apis import SUPPORTED_VERSIONS
from onceflow.protocol.build import build
from onceflow.protocol.codec import encode_response_pieces, request_type, response_type
from onceflow.protocol.writers import entity_writer
from tests.protocol.entities import entities


def _entity_classes(api_key: int) -> list[type[Any]]:
    versions = SUPPORTED_VERSIONS[api_key]
    classes: list[type[Any]] = []
    for version in range(versions.min, versions.max + 1):
        for body in (request_type(api_key, version), response_type(api_key, version)):
            classes += [body, body.__header_schema__]
    return classes


def _kio_bytes(entity: Any) -> bytes:
    buffer = io.BytesIO()
    kio_entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def _our_bytes(entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer.write, entity)
    return buffer.getvalue()


@pytest.mark.parametrize("api_key", sorted(SUPPORTED_VERSIONS))
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_writes_what_kio_writes(api_key: int, data: st.DataObject) -> None:
    for entity_class in _entity_classes(api_key):
        entity = data.draw(entities(entity_class), label=entity_class.__qualname__)
        assert _our_bytes(entity) == _kio_bytes(entity), entity_class


def _kio_frame(correlation_id: int, response: Any) -> bytes:
    header = response.__header_schema__(correlation_id=correlation_id)
    frame = _kio_bytes(header) + _kio_bytes(response)
    return len(frame).to_bytes(4, "big") + frame


@pytest.mark.parametrize("api_key", sorted(SUPPORTED_VERSIONS))
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_a_response_in_pieces_is_kios_frame(api_key: int, data: st.DataObject) -> None:
    versions = SUPPORTED_VERSIONS[api_key]
    for version in range(versions.min, versions.max + 1):
        response = data.draw(entities(response_type(api_key, version)), label=f"v{version}")
        assert b"".join(encode_response_pieces(3, response)) == _kio_frame(3, response)


@pytest.mark.parametrize("version", [4, 12])
def test_a_fetch_answer_sends_big_records_as_they_are(version: int) -> None:
    big, small = os.urandom(64 * 1024), os.urandom(100)
    partitions = [
        {
            "partition_index": index,
            "error_code": 0,
            "high_watermark": 5,
            "last_stable_offset": 5,
            "log_start_offset": 0,
            "aborted_transactions": None,
            "preferred_read_replica": -1,
            "records": records,
        }
        for index, records in enumerate([big, small, big])
    ]
    response = build(
        response_type(1, version),
        {
            "throttle_time": 0,
            "error_code": 0,
            "session_id": 0,
            "responses": [{"topic": "t", "partitions": partitions}],
        },
    )
    pieces = encode_response_pieces(9, response)
    assert b"".join(pieces) == _kio_frame(9, response)
    assert [piece for piece in pieces if piece is big] == [big, big]  # not copied
