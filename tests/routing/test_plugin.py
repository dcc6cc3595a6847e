from __future__ import annotations

from dataclasses import dataclass

import pytest

from routing import PluginConfigError, PluginFactory, param


@dataclass(frozen=True, slots=True)
class _Params:
    """Every supported parameter type."""

    rate: float = param(0.5, "a float")
    count: int = param(3, "an int")
    label: str = param("x", "a string")
    on: bool = param(False, "a bool")
    seed: int | None = param(None, "an optional int")

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")


FACTORY = PluginFactory("tests.routing.sample", "Sample plugin.\n\nMore.", "scorer", _Params, repr)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, _Params()),
        ({"rate": 2}, _Params(rate=2.0)),
        ({"rate": 0.25, "count": 0, "label": "y", "on": True}, _Params(0.25, 0, "y", True)),
        ({"seed": 9}, _Params(seed=9)),
        ({"seed": None}, _Params(seed=None)),
    ],
)
def test_parse_accepts_well_typed_params(raw: dict[str, object], expected: _Params) -> None:
    parsed = FACTORY.parse(raw)
    assert parsed == expected
    assert type(parsed.rate) is float


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"rat": 1.0},
            r"'sample': unknown parameter 'rat' \(known: count, label, on, rate, seed\)",
        ),
        ({"rate": "fast"}, r"'sample': parameter 'rate' must be float, got str 'fast'"),
        ({"rate": True}, r"parameter 'rate' must be float, got bool"),
        ({"count": 1.5}, r"parameter 'count' must be int, got float"),
        ({"count": True}, r"parameter 'count' must be int, got bool"),
        ({"on": 1}, r"parameter 'on' must be bool, got int"),
        ({"label": 3}, r"parameter 'label' must be str"),
        ({"seed": "1"}, r"parameter 'seed' must be int \| None"),
        ({"rate": None}, r"parameter 'rate' must be float, got NoneType"),
        ({"count": -1}, r"'sample': count must be >= 0, got -1"),
    ],
)
def test_parse_rejects_bad_params(raw: dict[str, object], message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        FACTORY.parse(raw)


def test_factory_type_is_the_module_name_and_doc_its_first_line() -> None:
    assert FACTORY.type == "sample"
    assert FACTORY.kind == "scorer"
    assert FACTORY.build({"count": 2}) == repr(_Params(count=2))
    info = FACTORY.describe()
    assert (info.type, info.kind, info.doc) == ("sample", "scorer", "Sample plugin.")
    assert [(p.name, p.type, p.default, p.doc) for p in info.params] == [
        ("rate", "float", 0.5, "a float"),
        ("count", "int", 3, "an int"),
        ("label", "str", "x", "a string"),
        ("on", "bool", False, "a bool"),
        ("seed", "int | None", None, "an optional int"),
    ]


@dataclass(frozen=True, slots=True)
class _ListParams:
    items: list[int] | None = None


def test_factory_refuses_non_scalar_params_at_definition() -> None:
    with pytest.raises(TypeError, match="'items' must be a scalar"):
        PluginFactory("x.listy", None, "filter", _ListParams, repr)
