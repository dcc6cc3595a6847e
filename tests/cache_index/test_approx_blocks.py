"""The approximate history's generations: one entry per block, bounded work per call."""

from __future__ import annotations

import random

from cache_index.approx_blocks import MAX_GENERATIONS, ApproxBlocks, budget_for
from cache_index.hashing import block_hashes

RNG = random.Random(11)


def chain(n: int) -> list[int]:
    return block_hashes([RNG.randrange(1 << 30) for _ in range(4 * n)], 4)


def test_a_turn_that_extends_a_prefix_moves_it_and_counts_only_its_tail() -> None:
    a = ApproxBlocks(capacity=1000)  # generations of 250 blocks
    first = chain(300)
    a.record(first)
    assert len(a) == 300 and a.depth(first) == 300
    longer = first + chain(8)
    a.record(longer)  # the known run moved to the current generation: no second entry
    assert len(a) == 308 and a.depth(longer) == 308
    assert sum(len(g) for g in a._gens) == 308


def test_the_least_recent_prompt_goes_first_and_a_touched_one_survives() -> None:
    a = ApproxBlocks(capacity=400)  # generations of 100 blocks
    old, kept = chain(100), chain(100)
    a.record(old)
    a.record(kept)
    for _ in range(2):
        a.record(chain(100))
    a.record(kept)  # touched again: now the most recent
    a.record(chain(100))
    assert len(a) == 400
    assert a.depth(old) == 0 and a.depth(kept) == 100


def test_eviction_work_per_call_is_capped_and_the_rest_is_paid_later() -> None:
    a = ApproxBlocks(capacity=1_000_000)
    for _ in range(10):
        a.record(chain(1000))
    a.set_capacity(10_000)  # a scrape says the cache is small: shrinks at once
    assert len(a) == 10_000
    removed = a.trim(0, budget=budget_for(1))
    assert removed == budget_for(1) and len(a) == 10_000 - budget_for(1)


def test_generations_stay_bounded_below_capacity() -> None:
    a = ApproxBlocks(capacity=4000)  # a working set far below capacity, touched in turns
    prompts = [chain(50) for _ in range(10)]
    for i in range(400):
        a.record(prompts[i % 10])
        assert len(a._gens) <= MAX_GENERATIONS + 1
        assert len(a) == sum(len(g) for g in a._gens) <= 4000
    assert all(a.depth(p) == 50 for p in prompts)


def test_duplicates_and_unchained_hashes_are_held() -> None:
    a = ApproxBlocks(capacity=100)
    a.record([5, 5, 6])
    a.record([7, 5])
    assert a.depth([5, 6]) == 2 and a.depth([7, 5, 6]) == 3 and a.depth([6, 9]) == 1
    a.clear()
    assert len(a) == 0 and a.depth([5]) == 0
