"""Plain mappings to and from config dataclasses, each value checked against its field's type.

A value of the wrong type, or a key no field has, is a :class:`ConfigError` naming the
field's dotted path (``train.max_steps: expected an integer, got 'x'``), with the closest
field name suggested for a misspelt key. A value is shown by :func:`short_repr`: bounded
however large it is (a YAML alias bomb expands to gigabytes when printed whole).
"""

from __future__ import annotations

import dataclasses
import difflib
import reprlib
import types
import typing
from collections.abc import Callable
from typing import Any

from aiayn.errors import ConfigError

# Values in messages: a few items per container, a few levels deep, then cut.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 120, 120, 60
REPR_LIMIT = 200


def short_repr(value: Any) -> str:
    """``repr(value)`` in at most about :data:`REPR_LIMIT` characters, computed without
    formatting the whole value."""
    text = _REPR.repr(value)
    return text if len(text) <= REPR_LIMIT else text[:REPR_LIMIT] + "..."


def to_dict(obj: Any) -> Any:
    """Plain dicts/lists/scalars (YAML- and JSON-safe) from nested config dataclasses."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert one YAML value against a field's type annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, tp, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {short_repr(value)}")
        item = typing.get_args(tp)[0]
        return tuple(_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if tp in _SCALARS:
        return _SCALARS[tp](value, where)
    if dataclasses.is_dataclass(tp):
        return from_dict(typing.cast(type, tp), value, where)
    return value


def _coerce_union(value: Any, tp: Any, where: str) -> Any:
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, where)
        except ConfigError:
            continue
    raise ConfigError(f"{where}: {short_repr(value)} has the wrong type (expected {tp})")


def _as_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: expected true or false, got {short_repr(value)}")


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {short_repr(value)}")
    return value


def _as_float(value: Any, where: str) -> float:
    if isinstance(value, str):
        # YAML 1.1 reads "1e-3" (no dot) as a string; accept what Python reads as a float.
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {short_repr(value)}")
    return float(value)


def _as_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {short_repr(value)}")
    return value


_SCALARS: dict[Any, Callable[[Any, str], Any]] = {bool: _as_bool, int: _as_int, float: _as_float, str: _as_str}


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys are errors naming the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {short_repr(data)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{path}: unknown field{hint}")
        kwargs[key] = _coerce(value, hints[key], path)
    return cls(**kwargs)
