"""Per workload, contender and load of a `bench routing` run: the least- and the most-used
replica's share of the step's successful requests, relative to the mean share, per seed.

Usage: python balance.py OUT_DIR (the run's --out, with its raw/*.jsonl).
"""

import collections
import glob
import json
import sys
from pathlib import Path

res: dict[tuple[str, str, float], dict[str, tuple[float, float]]] = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/raw/*.jsonl")):
    who, workload, seed = Path(f).stem.rsplit("-", 2)
    rows = [json.loads(line) for line in Path(f).read_text().splitlines()]
    replicas = {r["replica"] for r in rows if r.get("replica") is not None}
    if not replicas:  # a run older than the replica field
        continue
    for rate in sorted({r["rate"] for r in rows if r["phase"] == "step"}):
        got = collections.Counter(
            r["replica"]
            for r in rows
            if r["phase"] == "step"
            and r["rate"] == rate
            and r["status"] == 200
            and r.get("replica") is not None
        )
        counts = [got.get(x, 0) for x in replicas]
        mean = sum(counts) / len(counts)
        res[(workload, who, rate)][seed] = (min(counts) / mean, max(counts) / mean)
for (workload, who, rate), per_seed in sorted(res.items()):
    seeds = sorted(per_seed)
    low = " / ".join(f"{per_seed[s][0]:.2f}" for s in seeds)
    high = " / ".join(f"{per_seed[s][1]:.2f}" for s in seeds)
    print(f"{workload:16s} {who:24s} {rate:4.0f}  least {low}  most {high}")
