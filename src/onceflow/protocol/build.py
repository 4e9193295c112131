"""Build a versioned kio entity from plain values.

kio has one dataclass per API version. Handlers describe a response once, with
the newest field names, as keyword values, dicts and lists; `build` keeps the
fields the target version has, fills the rest from defaults, and converts
primitive values (milliseconds to timedelta, int to ErrorCode).
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import TZAware, i32Timedelta, i64Timedelta

Converter = Callable[[Any], Any]


def _milliseconds(value: Any) -> Any:
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(milliseconds=int(value))


def _datetime_from_ms(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromtimestamp(int(value) / 1000, tz=datetime.UTC)


def _error_code(value: Any) -> Any:
    return value if isinstance(value, ErrorCode) else ErrorCode(int(value))


def _converter_for(annotation: Any) -> Converter | None:
    """How a value becomes the field's, or None when it is taken as it is: most fields are,
    and a call per field and item was a fifth of the calls building a fetch's answer."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        item = _converter_for(typing.get_args(annotation)[0])
        if item is None:
            return tuple
        return lambda values: tuple(item(value) for value in values)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        inner = _converter_for(options[0])
        if inner is None:
            return None
        return lambda value: None if value is None else inner(value)
    if isinstance(annotation, type):
        if dataclasses.is_dataclass(annotation):
            return lambda value: value if isinstance(value, annotation) else build(annotation, value)
        if issubclass(annotation, (i32Timedelta, i64Timedelta)):
            return _milliseconds
        if issubclass(annotation, TZAware):
            return _datetime_from_ms
        if issubclass(annotation, ErrorCode):
            return _error_code
        if issubclass(annotation, uuid.UUID):
            return lambda value: (
                value if value is None or isinstance(value, uuid.UUID) else uuid.UUID(str(value))
            )
    return None


_FieldPlan = tuple[tuple[str, Converter | None, bool], ...]
_field_plans: dict[type[Any], _FieldPlan] = {}


def _field_plan(entity_class: type[Any]) -> _FieldPlan:
    plan = _field_plans.get(entity_class)
    if plan is None:
        plan = _field_plans[entity_class] = _make_field_plan(entity_class)
    return plan


def _make_field_plan(entity_class: type[Any]) -> _FieldPlan:
    hints = typing.get_type_hints(entity_class)
    plan = []
    for field in dataclasses.fields(entity_class):
        has_default = (
            field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        )
        plan.append((field.name, _converter_for(hints[field.name]), has_default))
    return tuple(plan)


def build(entity_class: type[Any], values: Mapping[str, Any] | None = None, /, **fields: Any) -> Any:
    """An instance of `entity_class` from the values it has fields for."""
    merged = {**(values or {}), **fields}
    kwargs: dict[str, Any] = {}
    for name, convert, has_default in _field_plan(entity_class):
        if name in merged:
            kwargs[name] = merged[name] if convert is None else convert(merged[name])
        elif not has_default:
            raise KeyError(f"{entity_class.__qualname__} v{entity_class.__version__} needs {name!r}")
    return entity_class(**kwargs)


def build_filled(entity_class: type[Any], values: Mapping[str, Any] | None = None, /, **fields: Any) -> Any:
    """As `build`, with every field neither given nor defaulted filled with its type's zero
    (0, "", empty, None where nullable), nested entities given as dicts filled alike: for
    answers that carry an error and nothing else worth saying."""
    merged = {**(values or {}), **fields}
    hints = typing.get_type_hints(entity_class)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(entity_class):
        annotation = hints[field.name]
        if field.name in merged:
            kwargs[field.name] = _filled(annotation, merged[field.name])
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            kwargs[field.name] = _zero(annotation)
    return build(entity_class, kwargs)


def _filled(annotation: Any, value: Any) -> Any:
    item_type = _entity_type(annotation)
    if item_type is None:
        return value
    if typing.get_origin(annotation) is tuple:
        return tuple(build_filled(item_type, item) if isinstance(item, Mapping) else item for item in value)
    return build_filled(item_type, value) if isinstance(value, Mapping) else value


def _entity_type(annotation: Any) -> type[Any] | None:
    """The entity class of a field holding entities (one, or a tuple of them), else None."""
    if typing.get_origin(annotation) is tuple:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return annotation if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) else None


def _zero(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is tuple:
        return ()
    if origin in (typing.Union, types.UnionType):
        return None
    if isinstance(annotation, type):
        if dataclasses.is_dataclass(annotation):
            return build_filled(annotation)
        if issubclass(annotation, ErrorCode):
            return ErrorCode.none
        if issubclass(annotation, (i32Timedelta, i64Timedelta, TZAware)):
            return 0
        if issubclass(annotation, uuid.UUID):
            return uuid.UUID(int=0)
        for kind, zero in ((bool, False), (str, ""), (bytes, b""), (float, 0.0)):
            if issubclass(annotation, kind):
                return zero
    return 0  # the integer types, kio's phantom ones too
