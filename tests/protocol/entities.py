"""Hypothesis strategies for any kio entity, built from its schema."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
from typing import Any

from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from onceflow.apis import SUPPORTED_VERSIONS
from onceflow.protocol.codec import request_type

_MS = datetime.timedelta(milliseconds=1)
_PRIMITIVES: dict[str, st.SearchStrategy[Any]] = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "uint8": st.integers(0, 2**8 - 1),
    "uint16": st.integers(0, 2**16 - 1),
    "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "bool": st.booleans(),
    "float64": st.floats(allow_nan=False, allow_infinity=False),
    "uuid": st.uuids(),
    "error_code": st.sampled_from(ErrorCode),
    "string": st.text(max_size=12),
    "bytes": st.binary(max_size=24),
    "records": st.binary(max_size=24),
    "timedelta_i32": st.integers(-(2**31), 2**31 - 1).map(lambda ms: ms * _MS),
    "timedelta_i64": st.integers(-(2**40), 2**40).map(lambda ms: ms * _MS),
    "datetime_i64": st.integers(0, 2**42).map(
        lambda ms: datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    ),
}


@functools.cache
def entities(entity_class: type[Any]) -> st.SearchStrategy[Any]:
    fields = {field.name: _field(field) for field in dataclasses.fields(entity_class)}
    return st.fixed_dictionaries(fields).map(lambda values: entity_class(**values))


def _field(field: dataclasses.Field[Any]) -> st.SearchStrategy[Any]:
    kind = classify_field(field)
    if isinstance(kind, PrimitiveField):
        value = _PRIMITIVES[get_schema_field_type(field)]
    elif isinstance(kind, EntityField):
        value = st.deferred(lambda: entities(kind.type_))
    else:
        element = (
            st.deferred(lambda: entities(kind.type_))
            if isinstance(kind, EntityTupleField)
            else _PRIMITIVES[get_schema_field_type(field)]
        )
        value = st.lists(element, max_size=3).map(tuple)
    # kio writes a tagged field only when it differs from its default, and never writes it as null.
    if is_optional(field) and get_field_tag(field) is None:
        return st.none() | value
    return value


def supported_request_types() -> list[type[Any]]:
    return [
        request_type(key, version)
        for key, versions in sorted(SUPPORTED_VERSIONS.items())
        for version in range(versions.min, versions.max + 1)
    ]


def encode(body: Any, correlation_id: int = 1) -> bytes:
    """A request frame, without its length prefix, as kio writes it."""
    header_class = body.__header_schema__
    header = header_class(
        request_api_key=body.__api_key__,
        request_api_version=body.__version__,
        correlation_id=correlation_id,
        client_id="entities",
    )
    buffer = io.BytesIO()
    entity_writer(header_class)(buffer, header)
    entity_writer(type(body))(buffer, body)
    return buffer.getvalue()
