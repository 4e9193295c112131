"""`protocol.writers` writes exactly kio's bytes, for every request and response (and their
headers) of every version the broker supports, with Hypothesis-drawn values."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer as kio_entity_writer

from onceflow.apis import SUPPORTED_VERSIONS
from onceflow.protocol.codec import request_type, response_type
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
