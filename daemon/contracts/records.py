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
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


Check = Callable[[Any, str], None]


def coerce(value: Any, tp: Any, where: str, check: Check | None = None) -> Any:
    """Check ``value`` against annotation ``tp``; return it (records built, tuples made)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], where, check)
    if tp is Any:
        return value
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) or value not in choices:
            raise MessageError(f"{where}: {str(value)[:20]!r} is not one of "
                               f"{', '.join(map(str, choices))}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise MessageError(f"{where}: expected true/false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MessageError(f"{where}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MessageError(f"{where}: expected a number")
        if not math.isfinite(value):
            raise MessageError(f"{where}: not finite")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise MessageError(f"{where}: expected a string")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise MessageError(f"{where}: expected a list")
        item = typing.get_args(tp)[0]
        items = [coerce(v, item, f"{where}[{i}]", check) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise MessageError(f"{where}: expected an object")
        _, item = typing.get_args(tp)
        return {str(k): coerce(v, item, f"{where}.{k}", check) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return build(tp, value, where, check)
    raise MessageError(f"{where}: unsupported type {tp!r}")  # pragma: no cover


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
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = coerce(data[f.name], hints[f.name], f"{where}.{f.name}", check)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise MessageError(f"{where}: missing field '{f.name}'")
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
