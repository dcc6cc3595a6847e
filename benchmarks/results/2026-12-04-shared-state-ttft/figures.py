"""The analysis's tables from a run's output folder, as computed.

Usage: python figures.py OUT_DIR default,default_again,w2_redis
(OUT_DIR: the `--out` of `llm-gateway bench routing`, with its raw/*.jsonl).
"""

from __future__ import annotations

import collections
import glob
import json
import math
import os
import statistics
import sys
from typing import Any


def rows_table(out: str, names: list[str]) -> None:
    """Hit rate / TTFT p90 of every row, then each contender against the default's."""
    with open(os.path.join(out, "results.json")) as f:
        data = json.load(f)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in data["seed_rows"]:
        rows[(r["workload"], r["offered_qps"], r["seed"], r["contender"].split(":")[1])] = r
    cells = sorted({k[:3] for k in rows})
    print("| workload | req/s | seed | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for c in cells:
        vals = [
            f"{r['hit_rate']:.3f} / {r['ttft_p90_s']:.3f}" if (r := rows.get((*c, n))) else "-"
            for n in names
        ]
        print(f"| {c[0]} | {c[1]:g} | {c[2]} | " + " | ".join(vals) + " |")
    print()

    def p90(c: tuple[Any, ...], n: str) -> float:
        return float(rows[(*c, n)]["ttft_p90_s"])

    for n in names[1:]:
        ratios = [p90(c, n) / p90(c, "default") for c in cells]
        gm = math.exp(statistics.mean(math.log(x) for x in ratios))
        over = sum(x > 1.05 for x in ratios)
        line = f"- {n}: {gm:.2f} ({min(ratios):.2f}-{max(ratios):.2f}), > 1.05x in {over}"
        if "default_again" in names and n != "default_again":
            # In band: within 1.05x of the worse of the two identical single processes.
            band = sum(
                p90(c, n) <= 1.05 * max(p90(c, "default"), p90(c, "default_again")) for c in cells
            )
            line += f", in band {band}/{len(cells)}"
        hits = [rows[(*c, n)]["hit_rate"] - rows[(*c, "default")]["hit_rate"] for c in cells]
        print(line + f"; hit - default's {min(hits):+.3f} to {max(hits):+.3f}")
    for n in names:
        rs = [rows[(*c, n)] for c in cells]
        cpu = {
            k: round(statistics.mean(r["cpu_cores"][k] for r in rs), 2) for k in rs[0]["cpu_cores"]
        }
        contended = sum(bool(r["contended"]) for r in rs)
        print(f"- CPU {n}: {cpu}, contended {contended}/{len(rs)}")


def group_split(out: str) -> None:
    """Per contender and workload: replicas serving a group within a step, and the share of
    requests not on their group's most used replica (means over steps)."""
    agg: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(out, "raw", "*.jsonl"))):
        base = os.path.basename(path)[: -len(".jsonl")].replace("gateway_", "")
        contender, workload = base.split("-")[:2]
        with open(path) as f:
            recs = [json.loads(x) for x in f if x.strip()]
        steps = [r for r in recs if r["phase"] == "step" and r.get("replica")]
        for step in sorted({r["step"] for r in steps}):
            mine = [r for r in steps if r["step"] == step]
            by: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
            for r in mine:
                by[r["group"]][r["replica"]] += 1
            off = sum(sum(c.values()) - max(c.values()) for c in by.values()) / len(mine)
            agg[(contender, workload)].append((statistics.mean(len(c) for c in by.values()), off))
    for (contender, workload), v in sorted(agg.items(), key=lambda kv: kv[0][::-1]):
        reps, off = statistics.mean(x[0] for x in v), statistics.mean(x[1] for x in v)
        print(f"| {workload} | {contender} | {reps:.2f} | {off:.3f} |")


if __name__ == "__main__":
    rows_table(sys.argv[1], sys.argv[2].split(","))
    print()
    group_split(sys.argv[1])
