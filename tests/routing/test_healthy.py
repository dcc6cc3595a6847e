from __future__ import annotations

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, names, replica


@pytest.mark.parametrize(
    ("health", "panic", "expected"),
    [
        ([True, True, True], 0.0, ["a", "b", "c"]),
        ([True, False, True], 0.0, ["a", "c"]),
        ([False, False, False], 0.0, []),
        ([False, False, True], 0.0, ["c"]),
        # 1 of 3 healthy (33%) is below a 50% panic threshold: keep everyone.
        ([False, False, True], 0.5, ["a", "b", "c"]),
        ([False, True, True], 0.5, ["b", "c"]),
        ([False, False, False], 0.5, ["a", "b", "c"]),
    ],
)
def test_healthy_filter(health: list[bool], panic: float, expected: list[str]) -> None:
    reps = [replica(n, healthy=h) for n, h in zip("abc", health, strict=True)]
    plugin = PLUGINS["healthy"].build({"panic_threshold": panic})
    assert names(plugin.filter(REQUEST, reps)) == expected


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_healthy_rejects_panic_threshold_out_of_range(bad: float) -> None:
    with pytest.raises(PluginConfigError, match=r"healthy.*panic_threshold"):
        PLUGINS["healthy"].build({"panic_threshold": bad})
