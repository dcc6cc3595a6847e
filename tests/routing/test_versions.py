"""Model versions: weighted draws, sticky sessions, the canary override, validation."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from routing.versions import Version, VersionSet, choose, on_line, weights

CANARY = VersionSet(
    "llama",
    (
        Version("v1", 90, "stable", labels={"version": "v1"}),
        Version("v2", 10, "initial", served_model="llama-v2"),
    ),
)
THREE = VersionSet(
    "llama",
    (
        Version("a", 50, "stable"),
        Version("b", 30, "progressive"),
        Version("c", 20, "initial"),
    ),
)


def _split(versions: VersionSet, draws: int, **kwargs: object) -> Counter[str]:
    rng = random.Random(1234)
    return Counter(choose(versions, None, rng, **kwargs).name for _ in range(draws))  # type: ignore[arg-type]


def test_weights_hold_within_three_percent_over_2000_draws() -> None:
    got = _split(CANARY, 2000)
    assert abs(got["v2"] / 2000 - 0.10) <= 0.03, got
    three = _split(THREE, 2000)
    for name, share in (("a", 0.5), ("b", 0.3), ("c", 0.2)):
        assert abs(three[name] / 2000 - share) <= 0.03, three


def test_sessions_stick_to_one_version_and_spread_by_weight() -> None:
    rng = random.Random(0)
    sessions = [f"conv-{i}" for i in range(2000)]
    first = {s: choose(CANARY, s, rng).name for s in sessions}
    # Every later turn of each conversation: the same version, whatever the generator does.
    for _ in range(3):
        assert {s: choose(CANARY, s, random.Random(99)).name for s in sessions} == first
    share = sum(v == "v2" for v in first.values()) / len(first)
    assert abs(share - 0.10) <= 0.03, share


def test_session_point_depends_on_the_model() -> None:
    other = VersionSet("mistral", CANARY.versions)
    rng = random.Random(0)
    sessions = [f"s{i}" for i in range(400)]
    same = sum(choose(CANARY, s, rng).name == choose(other, s, rng).name for s in sessions)
    # Independent lines: about 0.9^2 + 0.1^2 = 82% agree, not all of them.
    assert same < len(sessions) * 0.95


@pytest.mark.parametrize(("canary", "share"), [(100, 1.0), (0, 0.0), (50, 0.5)])
def test_canary_weight_overrides_the_configured_share(canary: int, share: float) -> None:
    got = _split(CANARY, 2000, canary_weight=canary)
    assert abs(got["v2"] / 2000 - share) <= 0.03, got


def test_override_splits_among_canaries_by_their_weights() -> None:
    assert weights(THREE, 40) == (60.0, 24.0, 16.0)
    zero = VersionSet(
        "m", (Version("s", 100, "stable"), Version("x", 0, "initial"), Version("y", 0, "initial"))
    )
    assert weights(zero, 40) == (60.0, 20.0, 20.0)
    assert weights(zero) == (100.0, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"0\.\.100"):
        weights(THREE, 101)


def test_a_session_keeps_its_point_under_an_override() -> None:
    rng = random.Random(0)
    on_v2 = [s for s in (f"s{i}" for i in range(500)) if choose(CANARY, s, rng).name == "v2"]
    assert on_v2
    # Raising the canary's share only moves sessions onto it, never off it.
    assert all(choose(CANARY, s, rng, canary_weight=60).name == "v2" for s in on_v2)


def test_zero_weight_versions_are_never_drawn() -> None:
    assert on_line((0.0, 100.0, 0.0), 0.0) == 1
    assert on_line((0.0, 100.0, 0.0), 99.999) == 1
    assert on_line((30.0, 70.0), 100.0) == 1  # the top edge (rounding)


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ((), "at least one version"),
        ((Version("a", 60, "stable"), Version("b", 30, "initial")), "sum to 100"),
        ((Version("a", 101, "stable"),), "weight must be 0..100"),
        ((Version("a", -1, "stable"), Version("b", 101, "initial")), "weight must be 0..100"),
        ((Version("a", 50, "stable"), Version("a", 50, "initial")), "unique"),
        ((Version("a", 50, "initial"), Version("b", 50, "progressive")), "exactly one"),
        ((Version("a", 50, "stable"), Version("b", 50, "stable")), "exactly one"),
        ((Version("a", 100, "beta"),), "stage must be"),  # type: ignore[arg-type]
    ],
)
def test_invalid_version_sets_are_refused(versions: tuple[Version, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VersionSet("llama", versions)
