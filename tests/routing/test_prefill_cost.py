"""The prefill_cost picker: cheapest estimated start, in prefill tokens."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from routing import PLUGINS, PluginConfigError, RequestFeatures
from tests.routing.replicas import MODEL, replica

PROMPT = 2304  # a 2,048-token shared prefix (128 blocks of 16) and a 256-token question


def _pick(
    in_flight: list[int],
    queued: list[int] | None = None,
    params: dict[str, Any] | None = None,
    **features: Any,
) -> tuple[str, str]:
    names = [f"r{i}" for i in range(len(in_flight))]
    queued = queued or [0] * len(names)
    reps = [
        replica(n, in_flight=x, queued_prefill_tokens=q)
        for n, x, q in zip(names, in_flight, queued, strict=True)
    ]
    req = RequestFeatures(model=MODEL, prompt_tokens=PROMPT, block_tokens=16, **features)
    picker = PLUGINS["prefill_cost"].build({"seed": 1, **(params or {})})
    pick = picker.pick(req, reps, [0.0] * len(reps))
    return reps[pick.index].name, pick.branch


@pytest.mark.parametrize(
    ("in_flight", "queued", "features", "expected"),
    [
        # Cold fleet: the least loaded.
        ([3, 1, 2], None, {}, ("r1", "miss_by_load")),
        # A busy holder still beats an idle replica that must prefill 2,048 tokens again.
        ([20, 0, 0], None, {"prefix_match": {"r0": 128}}, ("r0", "prefix_hit")),
        # ...until the prefill queued on it outweighs the miss.
        ([2, 0, 0], [4000, 0, 0], {"prefix_match": {"r0": 128}}, ("r1", "load_guard")),
        # Longer match wins between holders of equal load.
        ([1, 1, 0], None, {"prefix_match": {"r0": 64, "r1": 128}}, ("r1", "prefix_hit")),
        # Tier 1: the replica that served this very prompt.
        (
            [4, 0, 0],
            None,
            {"affinity_replica": "r0", "affinity_kind": "prompt_cache"},
            ("r0", "prompt_cache_hit"),
        ),
        (
            [4, 0, 0],
            None,
            {"affinity_replica": "r0", "affinity_kind": "session"},
            ("r0", "session"),
        ),
    ],
)
def test_branches(
    in_flight: list[int],
    queued: list[int] | None,
    features: dict[str, Any],
    expected: tuple[str, str],
) -> None:
    assert _pick(in_flight, queued, **features) == expected


def test_decode_weight_trades_load_against_cache() -> None:
    # 100 more running requests on the holder: 800 tokens at the default weight (< 2,048 miss),
    # 3,000 at weight 30 (> the miss).
    hit = {"prefix_match": {"r0": 128}}
    assert _pick([100, 0], **hit)[0] == "r0"
    assert _pick([100, 0], params={"decode_weight": 30.0}, **hit)[0] == "r1"


def test_cold_misses_spread_over_equal_replicas() -> None:
    picker = PLUGINS["prefill_cost"].build({"seed": 3})
    reps = [replica(f"r{i}") for i in range(4)]
    req = RequestFeatures(model=MODEL, prompt_tokens=PROMPT)
    counts = Counter(reps[picker.pick(req, reps, [0.0] * 4).index].name for _ in range(400))
    assert set(counts) == {"r0", "r1", "r2", "r3"} and min(counts.values()) > 60


def test_a_burst_on_one_prefix_stays_until_its_queue_outweighs_a_miss() -> None:
    # Between two scrapes only the gateway's own counts move: each routed request adds its
    # uncached prefill (256 on the holder, 2,304 elsewhere) and one in-flight request.
    picker = PLUGINS["prefill_cost"].build({"seed": 0})
    names = [f"r{i}" for i in range(4)]
    in_flight = dict.fromkeys(names, 0)
    queued = dict.fromkeys(names, 0)
    match = {"r0": 128}
    placed = []
    for _ in range(30):
        reps = [replica(n, in_flight=in_flight[n], queued_prefill_tokens=queued[n]) for n in names]
        req = RequestFeatures(model=MODEL, prompt_tokens=PROMPT, prefix_match=match)
        name = reps[picker.pick(req, reps, [0.0] * 4).index].name
        placed.append(name)
        in_flight[name] += 1
        queued[name] += PROMPT - 16 * match.get(name, 0)
    assert placed[:8] == ["r0"] * 8  # 8 x 256 queued < one 2,304-token miss
    assert set(placed) == set(names)  # then the others take their share


@pytest.mark.parametrize("params", [{"decode_weight": -1}, {"affinity_hit": 1.5}, {"bogus": 1}])
def test_bad_params(params: dict[str, Any]) -> None:
    with pytest.raises(PluginConfigError):
        PLUGINS["prefill_cost"].build(params)
