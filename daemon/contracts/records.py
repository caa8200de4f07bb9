"""Typed records from JSON: one checker for every message, request, command and report.

A record is a frozen dataclass whose annotations say what each field holds. :func:`build`
reads a decoded JSON object into one: it checks every field's type from the annotations
(recursively: nested records, lists, tuples, dicts, ``Literal`` choices, optionals), refuses a
missing field without a default, ignores unknown keys (a newer daemon of the same protocol
version may add fields), and then asks the record itself (its ``check()``, if it has one) for
what a type cannot say. Anything off is a :class:`MessageError` with a short path to the field,
so a bad payload is one log line and never a half-built record.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar, Union

from daemon.contracts.errors import MessageError

R = TypeVar("R")
Check = Callable[[Any, str], None]
# A converter checks one value against one annotation: (value, path to it, check) -> value.
Conv = Callable[[Any, str, "Check | None"], Any]
_CONVS: dict[Any, Conv] = {}
_FIELDS: dict[type, list[tuple[str, Conv, bool]]] = {}  # name, converter, required


def _fail(where: str, why: str) -> MessageError:
    return MessageError(f"{where}: {why}")


def _conv_bool(v: Any, where: str, check: Check | None) -> Any:
    if not isinstance(v, bool):
        raise _fail(where, "expected true/false")
    return v


def _conv_int(v: Any, where: str, check: Check | None) -> Any:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(where, "expected an integer")
    return v


def _conv_float(v: Any, where: str, check: Check | None) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(where, "expected a number")
    if not math.isfinite(v):
        raise _fail(where, "not finite")
    return float(v)


def _conv_str(v: Any, where: str, check: Check | None) -> Any:
    if not isinstance(v, str):
        raise _fail(where, "expected a string")
    return v


def _conv_any(v: Any, where: str, check: Check | None) -> Any:
    return v


def converter(tp: Any) -> Conv:
    """The converter of annotation ``tp``, made once and kept (messages are many, their
    types few: a heartbeat is checked with no reflection at all)."""
    conv = _CONVS.get(tp)
    if conv is None:
        conv = _CONVS[tp] = _make(tp)
    return conv


def _make(tp: Any) -> Conv:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        optional = type(None) in args
        inner = converter(next(a for a in args if a is not type(None)))

        def union(v: Any, where: str, check: Check | None) -> Any:
            return None if v is None and optional else inner(v, where, check)
        return union
    if tp is Any:
        return _conv_any
    if origin is Literal:
        choices = typing.get_args(tp)

        def literal(v: Any, where: str, check: Check | None) -> Any:
            if isinstance(v, bool) or v not in choices:
                raise _fail(where, f"{str(v)[:20]!r} is not one of "
                                   f"{', '.join(map(str, choices))}")
            return v
        return literal
    simple = {bool: _conv_bool, int: _conv_int, float: _conv_float, str: _conv_str}
    if tp in simple:
        return simple[tp]
    if origin in (list, tuple):
        item = converter(typing.get_args(tp)[0])
        as_list = origin is list

        def sequence(v: Any, where: str, check: Check | None) -> Any:
            if not isinstance(v, (list, tuple)):
                raise _fail(where, "expected a list")
            items = [item(x, f"{where}[{i}]", check) for i, x in enumerate(v)]
            return items if as_list else tuple(items)
        return sequence
    if origin is dict:
        value = converter(typing.get_args(tp)[1])

        def mapping(v: Any, where: str, check: Check | None) -> Any:
            if not isinstance(v, dict):
                raise _fail(where, "expected an object")
            return {str(k): value(x, f"{where}.{k}", check) for k, x in v.items()}
        return mapping
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        cls = tp

        def record(v: Any, where: str, check: Check | None) -> Any:
            return build(cls, v, where, check)
        return record
    raise TypeError(f"no converter for the annotation {tp!r}")


def _fields(cls: type) -> list[tuple[str, Conv, bool]]:
    got = _FIELDS.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls)
        got = _FIELDS[cls] = [
            (f.name, converter(hints[f.name]),
             f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls)]
    return got


def coerce(value: Any, tp: Any, where: str, check: Check | None = None) -> Any:
    """Check ``value`` against annotation ``tp``; return it (records built, tuples made)."""
    return converter(tp)(value, where, check)


def build(cls: type[R], data: Any, where: str, check: Check | None = None) -> R:
    """The record ``cls`` read from the JSON object ``data``.

    Args:
        cls: A dataclass.
        data: The decoded JSON (anything: it is checked).
        where: Where the value came from, for the error (``"cmd.args"``).
        check: Also called with every record built (nested ones too), for rules that span
            record types (the MQTT messages' node-id charset).

    Raises:
        MessageError: ``data`` is not such a record; the message names the field.
    """
    if not isinstance(data, dict):
        raise MessageError(f"{where}: expected an object")
    kwargs: dict[str, Any] = {}
    for name, conv, required in _fields(cls):
        if name in data:
            kwargs[name] = conv(data[name], f"{where}.{name}", check)
        elif required:
            raise MessageError(f"{where}: missing field '{name}'")
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:  # a record's own __post_init__ refused it
        raise MessageError(f"{where}: {str(exc)[:120]}") from None
    own = getattr(obj, "check", None)
    if callable(own):
        why = own()
        if why:
            raise MessageError(f"{where}: {why}")
    if check is not None:
        check(obj, where)
    return obj


def plain(record: Any) -> dict[str, Any]:
    """A record as JSON-ready data (tuples become lists; the inverse of :func:`build`)."""
    return typing.cast(dict[str, Any], _plain(dataclasses.asdict(record)))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
