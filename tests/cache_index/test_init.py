"""The package re-exports a sorted, complete public API."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import cache_index


def _isort_key(name: str) -> tuple[bool, bool, str]:
    # Same order as ruff's RUF022: CONSTANTS, then Classes, then functions.
    return (not name.isupper(), not name[:1].isupper(), name)


def test_all_is_sorted_and_resolves() -> None:
    assert cache_index.__all__ == sorted(cache_index.__all__, key=_isort_key)
    assert len(set(cache_index.__all__)) == len(cache_index.__all__)
    for name in cache_index.__all__:
        assert getattr(cache_index, name) is not None


def test_every_public_class_and_function_is_exported() -> None:
    missing = []
    for info in pkgutil.iter_modules(cache_index.__path__):
        module = importlib.import_module(f"cache_index.{info.name}")
        for name, obj in vars(module).items():
            public = not name.startswith("_") and getattr(obj, "__module__", "") == module.__name__
            if public and (inspect.isclass(obj) or inspect.isfunction(obj)):
                missing += [] if name in cache_index.__all__ else [f"{info.name}.{name}"]
    assert missing == []
