"""The contract between a plugin module and the registry: kind, params dataclass, factory."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from routing.types import PluginConfigError

Kind = Literal["filter", "scorer", "picker"]
# The method each kind must provide (the Filter / Scorer / Picker protocols).
KIND_METHOD: Mapping[Kind, str] = {"filter": "filter", "scorer": "score", "picker": "pick"}

T = TypeVar("T")
P = TypeVar("P")
Plugin = TypeVar("Plugin")

_SCALARS: tuple[type, ...] = (bool, int, float, str)


def param(default: T, doc: str) -> T:
    """A params-dataclass field with its default and a one-line doc (for describe_plugins)."""
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """One plugin parameter as documented: name, type, default, one-line doc."""

    name: str
    type: str
    default: object
    doc: str


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One plugin as documented: registry type, kind, one-line doc and its params."""

    type: str
    kind: Kind
    doc: str
    params: tuple[ParamInfo, ...]


def _arms(hint: object) -> tuple[object, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _type_name(hint: object) -> str:
    return " | ".join(
        "None" if a is type(None) else getattr(a, "__name__", str(a)) for a in _arms(hint)
    )


def _coerce(value: object, hint: object) -> tuple[bool, object]:
    """(matched, value) for a scalar or optional-scalar hint; TOML ints are accepted as floats."""
    for arm in _arms(hint):
        if arm is type(None) and value is None:
            return True, None
        if isinstance(value, bool):
            if arm is bool:
                return True, value
            continue
        if arm is float and isinstance(value, int | float):
            return True, float(value)
        if (arm is int and isinstance(value, int)) or (arm is str and isinstance(value, str)):
            return True, value
    return False, value


class PluginFactory(Generic[P, Plugin]):
    """Builds one plugin type from a params mapping; knows the plugin's kind and docs."""

    __slots__ = ("_fields", "_hints", "_make", "doc", "kind", "params_type", "type")

    def __init__(
        self,
        module: str,
        doc: str | None,
        kind: Kind,
        params_type: type[P],
        make: Callable[[P], Plugin],
    ) -> None:
        # The registry key is the module's own name, so key == module == TOML type by construction.
        self.type: str = module.rsplit(".", 1)[-1]
        self.kind: Kind = kind
        self.params_type = params_type
        self._make = make
        self.doc: str = doc.strip().splitlines()[0] if doc and doc.strip() else ""
        self._fields = {f.name: f for f in dataclasses.fields(params_type)}  # type: ignore[arg-type]
        self._hints: dict[str, object] = typing.get_type_hints(params_type)
        for name in self._fields:
            if not all(a is type(None) or a in _SCALARS for a in _arms(self._hints[name])):
                raise TypeError(f"{self.type}: parameter {name!r} must be a scalar or optional")

    def parse(self, raw: Mapping[str, object]) -> P:
        """Typed params from a config mapping; unknown, mistyped or invalid values are rejected."""
        values: dict[str, object] = {}
        for key, value in raw.items():
            if key not in self._fields:
                known = ", ".join(sorted(self._fields)) or "none"
                raise PluginConfigError(
                    f"plugin {self.type!r}: unknown parameter {key!r} (known: {known})"
                )
            hint = self._hints[key]
            ok, coerced = _coerce(value, hint)
            if not ok:
                raise PluginConfigError(
                    f"plugin {self.type!r}: parameter {key!r} must be {_type_name(hint)}, "
                    f"got {type(value).__name__} {value!r}"
                )
            values[key] = coerced
        try:
            return self.params_type(**values)
        except (ValueError, TypeError) as exc:
            raise PluginConfigError(f"plugin {self.type!r}: {exc}") from exc

    def build(self, raw: Mapping[str, object]) -> Plugin:
        """A fresh plugin instance (stateful plugins keep their own state)."""
        return self._make(self.parse(raw))

    def describe(self) -> PluginInfo:
        """Documentation of this plugin, generated from its params dataclass."""
        params = tuple(
            ParamInfo(
                name=name,
                type=_type_name(self._hints[name]),
                default=f.default,
                doc=str(f.metadata.get("doc", "")),
            )
            for name, f in self._fields.items()
        )
        return PluginInfo(type=self.type, kind=self.kind, doc=self.doc, params=params)


AnyFactory = PluginFactory[Any, Any]
