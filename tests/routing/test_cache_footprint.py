from __future__ import annotations

from dataclasses import replace

import pytest

from routing import PLUGINS, PluginConfigError
from tests.routing.replicas import REQUEST, replica


@pytest.mark.parametrize(
    ("blocks", "unit", "expected"),
    [
        ([0, 0], 64.0, [1.0, 1.0]),
        ([0, 64], 64.0, [1.0, 0.5]),
        ([128, 0, 384], 128.0, [0.75, 1.0, 0.25]),
        # A spread well under the unit barely matters.
        ([0, 4], 64.0, [1.0, 1 - 4 / 68]),
    ],
)
def test_cache_footprint_prefers_the_emptiest_cache(
    blocks: list[int], unit: float, expected: list[float]
) -> None:
    reps = [replica(f"r{i}", cached_blocks=b) for i, b in enumerate(blocks)]
    plugin = PLUGINS["cache_footprint"].build({"unit_blocks": unit})
    assert plugin.score(REQUEST, reps) == pytest.approx(expected)


def test_cache_footprint_counts_prompts_still_in_prefill_as_blocks() -> None:
    # r0 holds 100 blocks; r1 holds none yet but has a 2048-token prompt (128 blocks) in
    # flight: the prompt the index has not heard of yet makes r1 the fuller one.
    reps = [
        replica("r0", cached_blocks=100),
        replica("r1", cached_blocks=0, queued_prefill_tokens=2048),
    ]
    plugin = PLUGINS["cache_footprint"].build({"unit_blocks": 1.0})
    request = replace(REQUEST, block_tokens=16)
    assert plugin.score(request, reps) == pytest.approx([1.0, 1 - 28 / 29])


def test_cache_footprint_is_neutral_without_an_index() -> None:
    plugin = PLUGINS["cache_footprint"].build({})
    assert plugin.score(REQUEST, [replica("a"), replica("b")]) == [1.0, 1.0]
    # An unknown replica scores the mean of the known ones.
    mixed = [replica("a", cached_blocks=0), replica("b", cached_blocks=64), replica("c")]
    assert plugin.score(REQUEST, mixed) == pytest.approx([1.0, 0.5, 0.75])


def test_cache_footprint_rejects_a_zero_unit() -> None:
    with pytest.raises(PluginConfigError, match="unit_blocks must be > 0"):
        PLUGINS["cache_footprint"].build({"unit_blocks": 0})
