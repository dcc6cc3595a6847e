from __future__ import annotations

import routing


def test_all_is_sorted_and_complete() -> None:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical.
    assert routing.__all__ == sorted(
        routing.__all__, key=lambda n: (not n.isupper(), not n[0].isupper(), n)
    )
    public = {
        name
        for name, value in vars(routing).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("routing")
    }
    public |= {"BUILTIN_PROFILES", "PLUGINS", "Kind"}
    assert set(routing.__all__) == public
    for name in routing.__all__:
        assert hasattr(routing, name), name
