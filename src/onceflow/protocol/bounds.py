"""A bounds check of a request frame against its schema, before kio's native reader runs.

kio's native reader trusts the lengths it reads: an array that claims 2^31 elements makes it
allocate for all of them, and Rust aborts the whole process when that fails. Kafka's own readers
refuse any length larger than the bytes that remain; this walk does the same for every field of
every API, in one place, and refuses null where the schema does not allow it and negative
lengths. It allocates nothing, so a frame that passes is safe to hand to the native reader.

The walk also names the fixed-width integers it passes (`IntField`), which the fuzzer uses to set
each one to boundary values.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


class FrameBoundsError(ValueError):
    """The frame does not fit its schema: a length past the end, a forbidden null, a bad count."""


@dataclass(frozen=True, slots=True)
class IntField:
    """A fixed-width big-endian integer at `offset`: a value, or a length or count prefix."""

    offset: int
    width: int
    is_length: bool


# A whole request as received, or a view of it inside the connection's buffer.
Frame = bytes | memoryview
Visit = Callable[[IntField], None] | None
# A step checks one field that starts at `pos` and returns where the next one starts.
Step = Callable[[Frame, int, int, Visit], int]

_FIXED_WIDTHS = {
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_INTEGER_TYPES = {
    "int8",
    "int16",
    "uint16",
    "int32",
    "timedelta_i32",
    "int64",
    "timedelta_i64",
    "datetime_i64",
}
_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_MAX_VARINT_BYTES = 5


def check_frame(frame: Frame, header_class: type[Any], body_class: type[Any]) -> None:
    """Raise `FrameBoundsError` unless the header and body fit the frame."""
    walk_frame(frame, header_class, body_class, None)


def int_fields(frame: Frame, header_class: type[Any], body_class: type[Any]) -> list[IntField]:
    """The fixed-width integers of a well-formed frame, in order."""
    found: list[IntField] = []
    walk_frame(frame, header_class, body_class, found.append)
    return found


def walk_frame(frame: Frame, header_class: type[Any], body_class: type[Any], visit: Visit) -> int:
    end = len(frame)
    pos = _entity_step(header_class)(frame, 0, end, visit)
    return _entity_step(body_class)(frame, pos, end, visit)


def _short(pos: int, size: int, end: int) -> FrameBoundsError:
    return FrameBoundsError(f"{size} bytes needed at offset {pos}, {max(end - pos, 0)} left")


def _read_uvarint(buf: Frame, pos: int, end: int) -> tuple[int, int]:
    if pos < end and buf[pos] < 0x80:  # the common case: one byte
        return buf[pos], pos + 1
    value = shift = 0
    for index in range(pos, min(end, pos + _MAX_VARINT_BYTES)):
        byte = buf[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    raise FrameBoundsError(f"unterminated or over-long varint at offset {pos}")


def _fixed(width: int, integers: tuple[tuple[int, int], ...]) -> Step:
    """A run of fixed-width fields; `integers` are the (offset in the run, width) of its integers."""

    def step(buf: Frame, pos: int, end: int, visit: Visit) -> int:
        if pos + width > end:
            raise _short(pos, width, end)
        if visit is not None:
            for delta, size in integers:
                visit(IntField(pos + delta, size, False))
        return pos + width

    return step


LengthReader = Callable[[Frame, int, int, Visit], tuple[int, int]]


def _length_prefix(flexible: bool, wide: bool, nullable: bool, what: str) -> LengthReader:
    """Reads a length or count: (value, position after it); -1 for null where null is allowed."""
    lowest = -1 if nullable else 0

    def refuse(length: int, pos: int) -> FrameBoundsError:
        return FrameBoundsError(f"{what} length {length} at offset {pos} is not allowed")

    def read_compact(buf: Frame, pos: int, end: int, visit: Visit) -> tuple[int, int]:
        raw, pos = _read_uvarint(buf, pos, end)
        if raw - 1 < lowest:
            raise refuse(raw - 1, pos)
        return raw - 1, pos

    legacy = _INT32 if wide else _INT16
    size = legacy.size

    def read_legacy(buf: Frame, pos: int, end: int, visit: Visit) -> tuple[int, int]:
        if pos + size > end:
            raise _short(pos, size, end)
        if visit is not None:
            visit(IntField(pos, size, True))
        (length,) = legacy.unpack_from(buf, pos)
        if length < lowest:
            raise refuse(length, pos)
        return length, pos + size

    return read_compact if flexible else read_legacy


def _sized(flexible: bool, wide: bool, nullable: bool, what: str) -> Step:
    read_length = _length_prefix(flexible, wide, nullable, what)

    def step(buf: Frame, pos: int, end: int, visit: Visit) -> int:
        length, pos = read_length(buf, pos, end, visit)
        if length > 0:
            if pos + length > end:
                raise _short(pos, length, end)
            pos += length
        return pos

    return step


def _primitive(kafka_type: str, flexible: bool, nullable: bool) -> Step:
    width = _FIXED_WIDTHS.get(kafka_type)
    if width is not None:
        return _fixed(width, ((0, width),) if kafka_type in _INTEGER_TYPES else ())
    if kafka_type == "string":
        return _sized(flexible, False, nullable, "string")
    if kafka_type in ("bytes", "records"):
        return _sized(flexible, True, nullable, kafka_type)
    raise TypeError(f"no bounds rule for kafka type {kafka_type!r}")


def _array(element: Step, min_element_size: int, fixed_width: int, flexible: bool, nullable: bool) -> Step:
    """An array; `fixed_width` is its elements' size when they all have the same one, else 0."""
    read_count = _length_prefix(flexible, True, nullable, "array")

    def step(buf: Frame, pos: int, end: int, visit: Visit) -> int:
        count, pos = read_count(buf, pos, end, visit)
        if count <= 0:
            return pos
        # As Kafka does: no element is smaller than a byte, whatever the schema says.
        if pos + count * max(min_element_size, 1) > end:
            raise _short(pos, count * max(min_element_size, 1), end)
        if fixed_width and visit is None:
            return pos + count * fixed_width
        for _ in range(count):
            pos = element(buf, pos, end, visit)
        return pos

    return step


def _nullable_entity(entity: Step) -> Step:
    def step(buf: Frame, pos: int, end: int, visit: Visit) -> int:
        if pos >= end:
            raise _short(pos, 1, end)
        (marker,) = _INT8.unpack_from(buf, pos)
        if marker == -1:
            return pos + 1
        if marker != 1:
            raise FrameBoundsError(f"nullable struct marker {marker} at offset {pos}")
        return entity(buf, pos + 1, end, visit)

    return step


def _field_step(field: dataclasses.Field[Any], flexible: bool, is_header: bool, is_tag: bool) -> Step:
    """The step for one field, deciding nullability the way kio's reader does."""
    if is_header and field.name == "client_id":
        # Kafka keeps the header's client id a legacy nullable string, even in flexible headers.
        return _sized(False, False, True, "string")
    nullable = False if is_tag else is_optional(field)
    kind = classify_field(field)
    if isinstance(kind, PrimitiveField):
        return _primitive(get_schema_field_type(field), flexible, nullable)
    if isinstance(kind, PrimitiveTupleField):
        kafka_type = get_schema_field_type(field)
        return _array(
            _primitive(kafka_type, flexible, False),
            _primitive_min_size(kafka_type, flexible),
            _FIXED_WIDTHS.get(kafka_type, 0),
            flexible,
            nullable,
        )
    if isinstance(kind, EntityField):
        entity = _entity_step(kind.type_)
        return _nullable_entity(entity) if nullable else entity
    if isinstance(kind, EntityTupleField):
        return _array(_entity_step(kind.type_), _entity_min_size(kind.type_), 0, flexible, nullable)
    typing.assert_never(kind)


def _primitive_min_size(kafka_type: str, flexible: bool) -> int:
    width = _FIXED_WIDTHS.get(kafka_type)
    if width is not None:
        return width
    if flexible:
        return 1
    return 2 if kafka_type == "string" else 4


def _fixed_width(field: dataclasses.Field[Any]) -> int:
    if not isinstance(classify_field(field), PrimitiveField):
        return 0
    return _FIXED_WIDTHS.get(get_schema_field_type(field), 0)


def _entity_min_size(entity_class: type[Any]) -> int:
    flexible = entity_class.__flexible__
    size = 1 if flexible else 0  # the tagged-field count
    for field in dataclasses.fields(entity_class):
        if get_field_tag(field) is not None:
            continue
        kind = classify_field(field)
        if isinstance(kind, PrimitiveField):
            size += _primitive_min_size(get_schema_field_type(field), flexible)
        elif isinstance(kind, EntityField):
            size += 1 if is_optional(field) else _entity_min_size(kind.type_)
        else:
            size += 1 if flexible else 4
    return size


_entity_steps: dict[type[Any], Step] = {}


def _entity_step(entity_class: type[Any]) -> Step:
    step = _entity_steps.get(entity_class)
    if step is None:
        step = _entity_steps[entity_class] = _make_entity_step(entity_class)
    return step


def _make_entity_step(entity_class: type[Any]) -> Step:
    flexible = entity_class.__flexible__
    is_header = entity_class.__name__ == "RequestHeader"
    steps: list[Step] = []
    tagged: dict[int, Step] = {}
    run_width = 0  # consecutive fixed-width fields are checked as one run
    run_integers: list[tuple[int, int]] = []
    for field in dataclasses.fields(entity_class):
        tag = get_field_tag(field)
        if tag is not None:
            tagged[tag] = _field_step(field, flexible, is_header, True)
            continue
        width = _fixed_width(field)
        if width and not (is_header and field.name == "client_id"):
            if get_schema_field_type(field) in _INTEGER_TYPES:
                run_integers.append((run_width, width))
            run_width += width
            continue
        if run_width:
            steps.append(_fixed(run_width, tuple(run_integers)))
            run_width, run_integers = 0, []
        steps.append(_field_step(field, flexible, is_header, False))
    if run_width:
        steps.append(_fixed(run_width, tuple(run_integers)))

    def step(buf: Frame, pos: int, end: int, visit: Visit) -> int:
        for field_step in steps:
            pos = field_step(buf, pos, end, visit)
        if flexible:
            if pos < end and buf[pos] == 0:  # no tagged fields, the common case
                return pos + 1
            pos = _tagged_fields(buf, pos, end, visit, tagged)
        return pos

    return step


def _tagged_fields(buf: Frame, pos: int, end: int, visit: Visit, known: dict[int, Step]) -> int:
    count, pos = _read_uvarint(buf, pos, end)
    if not count:
        return pos
    if pos + count * 2 > end:  # a tag and a size, at least a byte each
        raise _short(pos, count * 2, end)
    for _ in range(count):
        tag, pos = _read_uvarint(buf, pos, end)
        size, pos = _read_uvarint(buf, pos, end)
        if pos + size > end:
            raise _short(pos, size, end)
        field_step = known.get(tag)
        if field_step is not None:
            field_step(buf, pos, pos + size, visit)
        pos += size
    return pos
