"""Per run of `bench routing`: TTFT p90 of requests that met another on their replica.

A request "met" one when another request was sent to the same replica less than 50 ms before
it (both then prefill together there). Also the TTFT p90 per gateway host (the load
generator's URL index) and the warm-up's conversations per replica.

Usage: python collisions.py OUT_DIR (the run's --out, with its raw/*.jsonl).
"""

import collections
import glob
import json
import sys
from pathlib import Path

WINDOW_S = 0.05


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


for f in sorted(glob.glob(sys.argv[1] + "/raw/*.jsonl")):
    rows = [json.loads(line) for line in Path(f).read_text().splitlines()]
    warm = collections.Counter(r["replica"] for r in rows if r["phase"] == "warmup")
    rs = [r for r in rows if r["phase"] != "warmup" and r["status"] == 200 and r["ttft"]]
    rs.sort(key=lambda r: r["sent"])
    met, alone = [], []
    for i, r in enumerate(rs):
        j = i - 1
        while j >= 0 and r["sent"] - rs[j]["sent"] < WINDOW_S and rs[j]["replica"] != r["replica"]:
            j -= 1
        hit = j >= 0 and r["sent"] - rs[j]["sent"] < WINDOW_S
        (met if hit else alone).append(r["ttft"])
    hosts = collections.defaultdict(list)
    for r in rs:
        hosts[r.get("host", 0)].append(r["ttft"])
    per_host = " ".join(f"host {h}: {q(v, 0.9):.4f}" for h, v in sorted(hosts.items()))
    p90 = q([r["ttft"] for r in rs], 0.9)
    print(
        f"{Path(f).stem}: warm-up per replica {sorted(warm.values())}; p90 {p90:.4f}"
        f" ({per_host}); met {len(met)} of {len(rs)}, p90 {q(met, 0.9):.3f} against"
        f" {q(alone, 0.9):.3f}"
    )
