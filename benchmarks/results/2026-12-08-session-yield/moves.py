"""Per contender, workload and seed of a `bench routing` run: how often a group's request went
to another replica than the group's previous request (a multi-round chat group is one user).

Usage: python moves.py OUT_DIR (the run's --out, with its raw/*.jsonl).
"""

import glob
import json
import sys
from pathlib import Path

for f in sorted(glob.glob(sys.argv[1] + "/raw/*.jsonl")):
    rows = sorted(
        (json.loads(line) for line in Path(f).read_text().splitlines()), key=lambda r: r["sent"]
    )
    last: dict[str, int] = {}
    follows = moves = 0
    for r in rows:
        if r["status"] != 200:
            continue
        if r["group"] in last:
            follows += 1
            moves += last[r["group"]] != r["replica"]
        last[r["group"]] = r["replica"]
    print(f"{Path(f).stem:45s} requests after the group's first {follows:5d}  moved {moves:4d}")
