"""One replica's routing history: an approximate LRU made of generation dicts, C-level bulk ops.

Built so no call on the event loop does work beyond its own prompt's blocks:
- a block lives in exactly one generation dict (the one of its last touch); the newest is
  the current one, a new one is opened every `span` blocks. No dict ever takes inserts after
  deletes: only the current one grows, old ones only shrink, so none rebuilds its table under
  churn (an exact LRU's OrderedDict, and the million-entry owners map beside it, rebuilt
  themselves in one go every ~size inserts: 5-23 ms stalls);
- recording, refreshing and matching are set operations on whole prompts (filter, update,
  takewhile over dict lookups) run in C, not a Python loop per block;
- eviction pops the oldest generation's newest entries (so within one prompt its tail goes
  first, as in vLLM), never frees a generation whole, and is capped per call (`budget`),
  the rest carried to the next call.
Recency is resolved to a generation (a quarter of the capacity, at most `MAX_SPAN` blocks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice, repeat, starmap, takewhile
from typing import TypeAlias

# Generations per capacity: recency is kept to a quarter of the history.
SPAN_DIVISOR = 4
# The current generation's dict grows to this many blocks at most: its last resize (a copy
# in C) stays ~0.1-0.2 ms; larger histories just have more generations.
MAX_SPAN = 32_768
# Generations kept even below capacity; the oldest is evicted past it (memory and the cost
# of looking a block up in each one stay bounded).
MAX_GENERATIONS = 2 * SPAN_DIVISOR + 2
# Eviction steps allowed per recorded block (plus a floor): more than one eviction per new
# block, so a carried remainder is always paid, yet a call stays linear in its prompt.
BUDGET_PER_BLOCK = 4
BUDGET_FLOOR = 256
# A held run of a prompt: the generation holding it, its start and stop positions.
Run: TypeAlias = tuple[dict[int, None], int, int]


def budget_for(blocks: int) -> int:
    """Eviction steps a call that records or evicts `blocks` blocks may take."""
    return BUDGET_PER_BLOCK * blocks + BUDGET_FLOOR


class ApproxBlocks:
    """Blocks assumed cached on one replica, evicting the least recently routed (tails first)."""

    def __init__(self, capacity: int) -> None:
        # Oldest first; each block is in exactly one, the last is the current generation.
        self._gens: deque[dict[int, None]] = deque([{}])
        self._count = 0
        self.capacity = self._span = 0
        # Bumped by every change: a memoised walk of a prompt is valid while it is unchanged.
        self._version = 0
        self._memo: tuple[Sequence[int], int, int, list[Run]] | None = None
        self.set_capacity(capacity)

    def __len__(self) -> int:
        return self._count

    def set_capacity(self, capacity: int) -> None:
        """Resize; shrinking evicts at once (a rare, scrape-driven call)."""
        self.capacity = capacity
        self._span = max(1, min(MAX_SPAN, capacity // SPAN_DIVISOR))
        self.trim(capacity, budget=None)

    def depth(self, hashes: Sequence[int]) -> int:
        """How many of `hashes`' leading blocks are held."""
        runs = self._runs(hashes)
        return runs[-1][2] if runs else 0

    def _runs(self, hashes: Sequence[int]) -> list[Run]:
        memo = self._memo
        if (
            memo is not None
            and memo[0] is hashes
            and memo[1] == self._version
            and memo[2] == len(hashes)
        ):
            return memo[3]
        gens, n, j = self._gens, len(hashes), 0
        runs: list[Run] = []
        while j < n:
            h = hashes[j]
            for g in reversed(gens):
                if h in g:
                    break
            else:
                break
            # A prompt recorded together sits in one generation: usually one run to the end.
            stop = j + len(list(takewhile(g.__contains__, islice(hashes, j, None))))
            runs.append((g, j, stop))
            j = stop
        # The gateway records the very prompt it just matched: the walk is not done twice.
        self._memo = (hashes, self._version, len(hashes), runs)
        return runs

    def record(self, hashes: Sequence[int]) -> None:
        """These blocks were routed here: hold them as the most recent."""
        runs = self._runs(hashes)
        self._version += 1
        gens = self._gens
        cur = gens[-1]
        recent = gens[-2] if len(gens) > 1 else cur
        before = len(cur)
        moved = 0
        for g, start, stop in runs:
            if g is not cur and g is not recent:
                # Getting old: the run moves to the current generation. In the newest two
                # it stays (no eviction is near): a next turn then costs only its new tail.
                n = len(g)
                deque(map(g.pop, islice(hashes, start, stop), repeat(None)), maxlen=0)
                moved += n - len(g)
                cur.update(zip(islice(hashes, start, stop), repeat(None)))
        # Past the known run: one C-level pass, leading blocks first so that popping from the
        # end evicts a prompt's tail first. A block held past a gap (not a chain's case) gets
        # a second entry, counted twice until the older one is evicted, never missed.
        cur.update(zip(islice(hashes, runs[-1][2] if runs else 0, None), repeat(None)))
        added = len(cur) - before - moved
        if not added:
            return
        self._count += added
        if len(cur) >= self._span:
            self._advance()
        budget = budget_for(added)
        if len(gens) > MAX_GENERATIONS:
            self.trim(self._count - len(gens[0]), budget)
        if self._count > self.capacity:
            self.trim(self.capacity, budget)

    def _advance(self) -> None:
        gens = self._gens
        while len(gens) > 1 and not gens[0]:
            gens.popleft()
        gens.append({})

    def adopt(self, hashes: Iterable[int]) -> None:
        """Take over blocks (oldest first) into an empty history."""
        seeded = dict.fromkeys(reversed(list(hashes)))
        self._version += 1
        self._gens = deque([seeded, {}])
        self._count = len(seeded)
        self.trim(self.capacity, budget=None)

    def trim(self, limit: int, budget: int | None) -> int:
        """Evict the least recent blocks down to `limit`, in at most `budget` steps; evicted."""
        excess = self._count - limit
        if excess <= 0:
            return 0
        self._version += 1
        todo = excess if budget is None else min(excess, budget)
        gens, removed = self._gens, 0
        while removed < todo:
            g = gens[0]
            if not g:
                if len(gens) == 1:
                    break
                gens.popleft()
                continue
            # Popped, never dropped whole: freeing a full generation's blocks at once is
            # ~0.5 ms of deallocation in one call.
            take = min(len(g), todo - removed)
            deque(starmap(g.popitem, repeat((), take)), maxlen=0)
            removed += take
        self._count -= removed
        return removed

    def clear(self) -> None:
        """Forget every block."""
        self._version += 1
        self._gens = deque([{}])
        self._count = 0
