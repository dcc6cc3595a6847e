from __future__ import annotations

from collections import Counter

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, replica

REPS = [replica(n) for n in "abcd"]


def _picks(seed: int, count: int) -> list[int]:
    picker = PLUGINS["random"].build({"seed": seed})
    return [picker.pick(REQUEST, REPS, [0.0] * 4).index for _ in range(count)]


def test_random_is_reproducible_with_a_seed() -> None:
    assert _picks(7, 50) == _picks(7, 50)
    assert _picks(7, 50) != _picks(8, 50)


def test_random_is_roughly_uniform() -> None:
    counts = Counter(_picks(1, 4000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(850 <= c <= 1150 for c in counts.values()), counts


def test_random_branch_label() -> None:
    picker = PLUGINS["random"].build({"seed": 3})
    assert picker.pick(REQUEST, REPS, [0.0] * 4).branch == "random"


def test_random_seed_must_be_int() -> None:
    with pytest.raises(PluginConfigError, match=r"'random'.*'seed'.*int"):
        PLUGINS["random"].build({"seed": "x"})
