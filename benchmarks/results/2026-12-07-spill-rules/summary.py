"""Per workload, contender and load of a `bench routing` run: TTFT p90, success and hit rate
per seed, from its raw logs (the hit rate from the answers' cached_tokens / prompt_tokens).

Usage: python summary.py OUT_DIR (the run's --out, with its raw/*.jsonl).
"""

import collections
import glob
import json
import sys
from pathlib import Path


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


res: dict[tuple[str, str, float], dict[str, tuple[float, float, float]]] = collections.defaultdict(
    dict
)
for f in sorted(glob.glob(sys.argv[1] + "/raw/*.jsonl")):
    who, workload, seed = Path(f).stem.rsplit("-", 2)
    rows = [json.loads(line) for line in Path(f).read_text().splitlines()]
    for rate in sorted({r["rate"] for r in rows if r["phase"] == "step"}):
        sent = [r for r in rows if r["phase"] == "step" and r["rate"] == rate]
        good = [r for r in sent if r["status"] == 200 and r["ttft"] is not None]
        cached = sum(r["cached_tokens"] or 0 for r in good)
        prompt = sum(r["prompt_tokens"] or 0 for r in good)
        ttft = q([r["ttft"] for r in good], 0.9)
        res[(workload, who, rate)][seed] = (ttft, len(good) / len(sent), cached / max(prompt, 1))
for (workload, who, rate), per_seed in sorted(res.items()):
    seeds = sorted(per_seed)
    cols = [
        " / ".join(f"{per_seed[s][k]:.{d}f}" for s in seeds) for k, d in ((0, 2), (1, 3), (2, 3))
    ]
    print(f"{workload:15s} {who:22s} {rate:4.0f}  p90 {cols[0]}  ok {cols[1]}  hit {cols[2]}")
