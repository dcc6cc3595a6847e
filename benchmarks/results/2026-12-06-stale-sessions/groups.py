"""Per step of a `bench routing` run: placement of the groups and requests over the replicas.

Usage: python groups.py OUT_DIR (the run's --out, with its raw/*.jsonl).
"""

import collections
import glob
import json
import sys
from pathlib import Path


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


for f in sorted(glob.glob(sys.argv[1] + "/raw/*.jsonl")):
    rows = [json.loads(line) for line in Path(f).read_text().splitlines()]
    warm = collections.Counter(r["replica"] for r in rows if r["phase"] == "warmup")
    print(f.split("/")[-1][:-6], "warm groups/replica", sorted(warm.values()))
    for step in sorted({r["step"] for r in rows if r["phase"] != "warmup"}):
        rs = [r for r in rows if r["step"] == step and r["phase"] != "warmup"]
        rs = [r for r in rs if r["status"] == 200]
        if not rs:
            print("  step", step, "no successes")
            continue
        per = collections.Counter(r["replica"] for r in rs)
        groups = collections.defaultdict(set)
        for r in rs:
            groups[r["group"]].add(r["replica"])
        split = sum(len(v) > 1 for v in groups.values())
        cached = sum(r["cached_tokens"] or 0 for r in rs)
        hit = cached / max(1, sum(r["prompt_tokens"] or 0 for r in rs))
        ttft = [r["ttft"] for r in rs if r["ttft"] is not None]
        print(
            f"  step {step} rate {rs[0]['rate']} n {len(rs)} p50 {q(ttft, 0.5):.3f}"
            f" p90 {q(ttft, 0.9):.3f} hit {hit:.3f} split {split}/{len(groups)}"
            f" req/replica {sorted(per.values())}"
        )
