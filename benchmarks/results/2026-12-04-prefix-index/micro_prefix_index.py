"""PrefixIndex.match + record_routed per call: 16 replicas, 500-block prompts, index at its bound.

Run from a tree (PYTHONPATH=<tree>): python micro_prefix_index.py [requests] [seed] [nogc].
`nogc` disables the cyclic collector after the fill: the benchmark's own conversation token
lists (millions of references) make each full collection ~10 ms, landing in whichever call
allocates at that moment; the gateway tunes its collector apart (gateway/http/gc_policy.py).
Each replica's history is the default bound (16,384 blocks x history_ratio 4 = 65,536 blocks),
filled first with distinct 500-block prompts (1,048,576 blocks in all). Then conversations:
30% new 500-block prompts, 70% an earlier conversation grown by 8 blocks (back to 500 past
700), each matched then recorded on its home replica, as Affinity.lookup and .record do.
Prints median, p99, p99.9 and max per call in microseconds, and calls over 1 ms.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time

from cache_index.hashing import block_hashes
from cache_index.prefix_index import PrefixIndex

REPLICAS, BLOCKS, TOKENS_PER_BLOCK = 16, 500, 4
CAPACITY = 16_384
RATIO = 4.0


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    idx = PrefixIndex(default_capacity=CAPACITY, approx_ratio=RATIO, max_total_blocks=2_000_000)
    names = [f"r{i}" for i in range(REPLICAS)]
    for name in names:
        idx.set_capacity(name, CAPACITY)
    per_replica = int(CAPACITY * RATIO) // BLOCKS + 2
    for name in names:
        for _ in range(per_replica):
            idx.record_routed(name, [rng.getrandbits(64) for _ in range(BLOCKS)], 0.0)
    if "nogc" in sys.argv[3:]:
        gc.disable()
    convs: list[tuple[list[int], str]] = []
    match_us: list[float] = []
    record_us: list[float] = []
    for _ in range(n):
        if not convs or rng.random() < 0.3:
            convs.append(([rng.randrange(1 << 30) for _ in range(BLOCKS * TOKENS_PER_BLOCK)], ""))
            i = len(convs) - 1
            convs[i] = (convs[i][0], rng.choice(names))
        else:
            i = rng.randrange(max(0, len(convs) - 200), len(convs))
            tokens, home = convs[i]
            tokens = tokens + [rng.randrange(1 << 30) for _ in range(8 * TOKENS_PER_BLOCK)]
            if len(tokens) > 700 * TOKENS_PER_BLOCK:
                tokens = tokens[: BLOCKS * TOKENS_PER_BLOCK]
            convs[i] = (tokens, home)
        tokens, home = convs[i]
        hashes = block_hashes(tokens, TOKENS_PER_BLOCK)
        t0 = time.perf_counter_ns()
        idx.match(hashes)
        t1 = time.perf_counter_ns()
        idx.record_routed(home, hashes, 0.0)
        t2 = time.perf_counter_ns()
        match_us.append((t1 - t0) / 1000)
        record_us.append((t2 - t1) / 1000)
    both = [a + b for a, b in zip(match_us, record_us, strict=True)]
    for label, xs in (("match", match_us), ("record_routed", record_us), ("both", both)):
        print(
            f"{label}: median {statistics.median(xs):.1f} p99 {_quantile(xs, 0.99):.1f}"
            f" p99.9 {_quantile(xs, 0.999):.1f} max {max(xs):.1f} us,"
            f" {sum(x > 1000 for x in xs)} of {len(xs)} calls > 1 ms"
        )
    print(f"index blocks {len(idx)}")


if __name__ == "__main__":
    main()
