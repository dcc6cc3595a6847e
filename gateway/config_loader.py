"""Strict mapping -> frozen dataclass conversion: unknown keys and wrong types name their path."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

T = TypeVar("T")


class ConfigError(Exception):
    """A configuration file is unreadable, has an unknown key, or a value of the wrong type."""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"array of {_type_name(typing.get_args(tp)[0])}"
    if origin in (dict, Mapping):
        return f"table of {_type_name(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "table"
    if tp is type(None):
        return "nothing"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except ConfigError:
                continue
        raise ConfigError(f"{path}: expected {_type_name(tp)}, got {type(value).__name__}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {type(value).__name__}")
        (item_tp, *_rest) = typing.get_args(tp)
        return tuple(_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {type(value).__name__}")
        _key_tp, val_tp = typing.get_args(tp)
        return {str(k): _convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a table, got {type(value).__name__}")
        return load_dataclass(tp, value, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected number, got {type(value).__name__}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected integer, got {type(value).__name__}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {type(value).__name__}")
        return value
    raise ConfigError(f"{path}: unsupported config type {tp!r}")


def load_dataclass(cls: type[T], data: Mapping[str, Any], path: str = "") -> T:
    """Build dataclass `cls` from `data`, rejecting unknown keys and mistyped values."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else key
        if key not in fields:
            raise ConfigError(f"{key_path}: unknown key")
        kwargs[key] = _convert(hints[key], value, key_path)
    for name, f in fields.items():
        if (
            name not in kwargs
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ):
            raise ConfigError(f"{path + '.' if path else ''}{name}: missing required key")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from None
