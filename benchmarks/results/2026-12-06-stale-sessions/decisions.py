"""The decision lines of one group split over replicas, beside each request's outcome.

Usage: python decisions.py LOG OUT_DIR SEED: LOG is the gateway's log with its decision lines
(decision-log.patch), OUT_DIR the run's --out.
"""

import collections
import glob
import json
import re
import sys
from pathlib import Path

log_path, out, seed = sys.argv[1:4]
raw = {}
for line in Path(glob.glob(f"{out}/raw/*-s{seed}.jsonl")[0]).read_text().splitlines():
    r = json.loads(line)
    raw[r["rid"]] = r
rows = []
for line in Path(log_path).read_text().splitlines():
    if "llm_gateway.decision" not in line:
        continue
    kv = dict(re.findall(r"(\w+)=(\S+)", line.split(": ", 1)[1]))
    if kv["request_id"] in raw:
        rows.append((line[11:23], kv, raw[kv["request_id"]]))
print(collections.Counter(kv["branch"] for _, kv, _ in rows))
by_group = collections.defaultdict(list)
for t, kv, r in rows:
    by_group[r["group"]].append((t, kv, r))
for g, lst in by_group.items():
    reps = collections.Counter(kv["replica"] for _, kv, r in lst if r["phase"] != "warmup")
    if len(reps) > 1:
        print(g, dict(reps))
        for t, kv, r in lst:
            ttft = r["ttft"] if r["ttft"] is not None else -1.0
            print(
                f"    {t} {r['phase'][:4]} {kv['replica']} {kv['branch']} session"
                f" {kv['session']} prefix_match {kv['prefix_match']} ttft {ttft:.2f}"
                f" cached {r['cached_tokens']}"
            )
        break
