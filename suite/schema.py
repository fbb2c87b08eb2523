"""Build frozen dataclasses from parsed YAML, strictly: unknown keys, missing fields and wrong types are
errors that name the file, the key path (e.g. `cases[2].shape.budget`), the bad value and what was expected.
"""
from __future__ import annotations

import dataclasses
import reprlib
import types
import typing
from typing import Any, Literal, get_args, get_origin

from kdbench.errors import ScenarioError


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 60, 60, 6, 4, 3


def _short(value: Any) -> str:
    """A bounded repr: an aliased YAML value may hold billions of shared items."""
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return f"a mapping with keys {', '.join(f.name for f in dataclasses.fields(tp))}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def convert(tp: Any, value: Any, file: str, path: str) -> Any:
    """Check `value` against the type annotation `tp` and convert it (lists -> tuples, dicts -> dataclasses)."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return convert(arg, value, file, path)
            except ScenarioError:
                continue
        raise ScenarioError(file, path, f"got {_short(value)}, expected {_type_name(tp)}")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ScenarioError(file, path, f"got {_short(value)}, expected {_type_name(tp)}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ScenarioError(file, path, f"got {_short(value)}, expected {_type_name(tp)}")
        (item,) = get_args(tp)[:1]
        return tuple(convert(item, v, file, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ScenarioError(file, path, f"got {_short(value)}, expected a mapping")
        _, vt = get_args(tp)
        return {str(k): convert(vt, v, file, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, file, path)
    return _scalar(tp, value, file, path)


def _scalar(tp: Any, value: Any, file: str, path: str) -> Any:
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        type(None): value is None,
        Any: True,
    }.get(tp)
    if ok is None:
        raise TypeError(f"schema: unsupported annotation {tp!r}")
    if not ok:
        raise ScenarioError(file, path, f"got {_short(value)}, expected {_type_name(tp)}")
    return float(value) if tp is float else value


def build(cls: type, data: Any, file: str, path: str = ""):
    """Instantiate dataclass `cls` from a mapping; every key must be a field, every required field present."""
    where = path or "top level"
    if not isinstance(data, dict):
        raise ScenarioError(file, path, f"got {_short(data)}, expected {_type_name(cls)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ScenarioError(file, _join(path, str(unknown[0])),
                            f"unknown key; valid keys at {where}: {', '.join(fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = convert(hints[name], data[name], file, _join(path, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ScenarioError(file, _join(path, name), f"missing required key ({_type_name(hints[name])})")
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if check is not None:
        problem = check()
        if problem:
            key, message = problem
            raise ScenarioError(file, _join(path, key), message)
    return obj


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
