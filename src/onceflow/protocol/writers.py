"""Entity writers that write exactly kio's bytes, compiled once per entity class.

kio's `entity_writer` calls a function per field and makes a BytesIO per flexible entity for its
tagged fields, even when none is set: encoding responses took a quarter of a busy broker's CPU.
Here each entity class becomes one generated function: a run of fixed-width fields goes out in
one `struct.pack`, strings and arrays are written inline, and tagged fields go through kio's own
writers only when one differs from its default. What each field is (Kafka type, nullability,
tag, default) comes from kio's introspection, so both writers follow one schema, and
tests/protocol/test_writers.py compares their bytes for every entity the broker uses.

A writer takes the output's `write` method and the entity: `write_entity(buffer.write, entity)`.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, fields
from typing import Any

from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._serialize import get_field_writer
from kio.serial.errors import OutOfBoundValue
from kio.static.constants import uuid_zero

Write = Callable[[bytes], Any]
EntityWriter = Callable[[Write, Any], None]

# Fixed-width Kafka types: the struct format, and the value's expression ({0} is the value).
_FIXED = {
    "int8": ("b", "{0}"),
    "int16": ("h", "{0}"),
    "int32": ("i", "{0}"),
    "int64": ("q", "{0}"),
    "uint8": ("B", "{0}"),
    "uint16": ("H", "{0}"),
    "uint32": ("I", "{0}"),
    "uint64": ("Q", "{0}"),
    "float64": ("d", "{0}"),
    "bool": ("?", "{0}"),
    "error_code": ("h", "{0}.value"),
    "timedelta_i32": ("i", "round({0}.total_seconds() * 1000)"),
    "timedelta_i64": ("q", "round({0}.total_seconds() * 1000)"),
    "datetime_i64": ("q", "round({0}.timestamp() * 1000)"),
    "uuid": ("16s", "(_UUID_ZERO if {0} is None else {0}.bytes)"),
}
_NULLABLE_DATETIME = ("q", "(-1 if {0} is None else round({0}.timestamp() * 1000))")
_INT16_MAX = 2**15 - 1
_INT32_MAX = 2**31 - 1
_SMALL_UVARINTS = [bytes((value,)) for value in range(128)]
_NULL_ENTITY = b"\xff"  # KIP-893's marker int8 -1; a present one is 1
_PRESENT_ENTITY = b"\x01"


def uvarint(value: int) -> bytes:
    if value < 128:
        return _SMALL_UVARINTS[value]
    out = bytearray()
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compact(write: Write, value: str | bytes | None) -> None:
    if value is None:
        raise TypeError("Unexpectedly received None value")
    data = value.encode() if isinstance(value, str) else value
    write(uvarint(len(data) + 1))
    write(data)


def _nullable_compact(write: Write, value: str | bytes | None) -> None:
    if value is None:
        write(b"\x00")
    else:
        _compact(write, value)


def _legacy_string(write: Write, value: str | None) -> None:
    if value is None:
        raise TypeError("Unexpectedly received None value")
    _nullable_legacy_string(write, value)


def _nullable_legacy_string(write: Write, value: str | None) -> None:
    if value is None:
        write(b"\xff\xff")
        return
    data = value.encode()
    if len(data) > _INT16_MAX:
        raise OutOfBoundValue(f"String is too long for legacy string format ({len(data)} > {_INT16_MAX})")
    write(len(data).to_bytes(2, "big"))
    write(data)


def _legacy_bytes(write: Write, value: bytes | None) -> None:
    if value is None:
        raise TypeError("Unexpectedly received None value")
    _nullable_legacy_bytes(write, value)


def _nullable_legacy_bytes(write: Write, value: bytes | None) -> None:
    if value is None:
        write(b"\xff\xff\xff\xff")
        return
    if len(value) > _INT32_MAX:
        raise OutOfBoundValue(f"Bytes is too long for legacy string format ({len(value)} > {_INT32_MAX})")
    write(len(value).to_bytes(4, "big"))
    write(value)


# (Kafka type, flexible, nullable) -> writer, for the types that are not fixed-width.
_VARIABLE: dict[tuple[str, bool, bool], Callable[[Write, Any], None]] = {
    ("string", True, False): _compact,
    ("string", True, True): _nullable_compact,
    ("string", False, False): _legacy_string,
    ("string", False, True): _nullable_legacy_string,
    **{(kind, True, False): _compact for kind in ("bytes", "records")},
    **{(kind, True, True): _nullable_compact for kind in ("bytes", "records")},
    **{(kind, False, False): _legacy_bytes for kind in ("bytes", "records")},
    **{(kind, False, True): _nullable_legacy_bytes for kind in ("bytes", "records")},
}


def _fixed(kafka_type: str, nullable: bool) -> tuple[str, str] | None:
    if kafka_type == "datetime_i64" and nullable:
        return _NULLABLE_DATETIME
    if nullable and kafka_type != "uuid":
        return None
    return _FIXED.get(kafka_type)


def _array_writer(item: Callable[[Write, Any], None], flexible: bool) -> Callable[[Write, Any], None]:
    def write_array(write: Write, items: Sequence[Any] | None) -> None:
        if items is None:
            write(b"\x00" if flexible else b"\xff\xff\xff\xff")
            return
        if flexible:
            write(uvarint(len(items) + 1))
        elif len(items) > _INT32_MAX:
            raise OutOfBoundValue(f"Sequence is too long for legacy array format ({len(items)})")
        else:
            write(len(items).to_bytes(4, "big"))
        for value in items:
            item(write, value)

    return write_array


def _fixed_item_writer(fixed: tuple[str, str]) -> Callable[[Write, Any], None]:
    namespace: dict[str, Any] = {"_pack": struct.Struct(">" + fixed[0]).pack, "_UUID_ZERO": uuid_zero.bytes}
    exec(f"def write_item(write, value):\n    write(_pack({fixed[1].format('value')}))\n", namespace)
    item: Callable[[Write, Any], None] = namespace["write_item"]
    return item


def _nullable_entity(write_entity: EntityWriter) -> EntityWriter:
    def write_nullable(write: Write, entity: Any) -> None:
        if entity is None:
            write(_NULL_ENTITY)
        else:
            write(_PRESENT_ENTITY)
            write_entity(write, entity)

    return write_nullable


_writers: dict[type[Any], EntityWriter] = {}


def entity_writer(entity_class: type[Any]) -> EntityWriter:
    """The writer of `entity_class`: `writer(buffer.write, entity)` writes what kio's would."""
    writer = _writers.get(entity_class)
    if writer is None:
        writer = _writers[entity_class] = _compile(entity_class)
    return writer


def _compile(entity_class: type[Any]) -> EntityWriter:
    flexible = bool(entity_class.__flexible__)
    is_request_header = entity_class.__name__ == "RequestHeader"
    namespace: dict[str, Any] = {"_UUID_ZERO": uuid_zero.bytes}
    lines: list[str] = []
    run_format = ""
    run_values: list[str] = []

    def end_run() -> None:
        nonlocal run_format, run_values
        if run_format:
            name = f"_pack{len(namespace)}"
            namespace[name] = struct.Struct(">" + run_format).pack
            lines.append(f"    write({name}({', '.join(run_values)}))")
        run_format = ""
        run_values = []

    def call(writer: Callable[..., Any], value: str) -> None:
        end_run()
        name = f"_write{len(namespace)}"
        namespace[name] = writer
        lines.append(f"    {name}(write, {value})")

    tagged: list[tuple[int, Field[Any]]] = []
    for field in fields(entity_class):
        if not field.name.isidentifier():
            raise ValueError(f"{entity_class.__qualname__} has a field named {field.name!r}")
        tag = get_field_tag(field)
        if tag is not None:
            tagged.append((tag, field))
            continue
        value = f"entity.{field.name}"
        if is_request_header and field.name == "client_id":
            # Kafka writes the request header's client id as a legacy string, flexible or not.
            call(_nullable_legacy_string, value)
            continue
        nullable = is_optional(field)
        kind = classify_field(field)
        if isinstance(kind, PrimitiveField):
            kafka_type = get_schema_field_type(field)
            fixed = _fixed(kafka_type, nullable)
            if fixed is not None:
                run_format += fixed[0]
                run_values.append(fixed[1].format(value))
            elif (kafka_type, flexible, nullable) in _VARIABLE:
                call(_VARIABLE[kafka_type, flexible, nullable], value)
            else:  # kio raises for it; let it say why
                get_field_writer(field, flexible, is_request_header, is_tag=False)
                raise AssertionError(f"no writer for {field}")  # pragma: no cover
        elif isinstance(kind, EntityField):
            write_entity = entity_writer(kind.type_)
            call(_nullable_entity(write_entity) if nullable else write_entity, value)
        elif isinstance(kind, PrimitiveTupleField):
            kafka_type = get_schema_field_type(field)
            fixed = _fixed(kafka_type, False)
            item = _fixed_item_writer(fixed) if fixed is not None else _VARIABLE[kafka_type, flexible, False]
            call(_array_writer(item, flexible), value)
        elif isinstance(kind, EntityTupleField):
            call(_array_writer(entity_writer(kind.type_), flexible), value)
    if flexible and not tagged:
        run_format += "x"  # no tagged fields: their count, 0
    elif flexible:
        call(_tagged_fields_writer(tagged, is_request_header), "entity")
    end_run()
    source = "def write_entity(write, entity):\n" + ("\n".join(lines) or "    pass") + "\n"
    exec(source, namespace)
    writer: EntityWriter = namespace["write_entity"]
    return writer


def _tagged_fields_writer(tagged: list[tuple[int, Field[Any]]], is_request_header: bool) -> EntityWriter:
    """Tagged fields as kio writes them: those that differ from their default, by tag, each
    through kio's own writer."""
    plan = [
        (
            tag,
            field.name,
            field.default,
            get_tagged_field_default(field),
            get_field_writer(field, True, is_request_header, is_tag=True),
        )
        for tag, field in sorted(tagged, key=lambda entry: entry[0])
    ]

    def write_tagged_fields(write: Write, entity: Any) -> None:
        present = []
        for tag, name, default, implicit_default, write_field in plan:
            value = getattr(entity, name)
            if value == default or (default == MISSING and value == implicit_default):
                continue
            buffer = io.BytesIO()
            write_field(buffer, value)
            encoded = buffer.getvalue()
            present.append(uvarint(tag) + uvarint(len(encoded)) + encoded)
        write(uvarint(len(present)))
        for encoded_field in present:
            write(encoded_field)

    return write_tagged_fields
