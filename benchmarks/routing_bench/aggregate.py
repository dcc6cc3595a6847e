"""Rows of several seeds folded into one row per contender x workload x offered load.

benchmarks.md asks for >= 3 seeds: at a saturation knee one seed's placement of prefixes
decides much of the outcome, so a single run is a sample, not a measurement. Latencies,
throughput, hit rate and imbalance are the median over seeds (robust to one unlucky seed);
success rate is the mean (every failed request counts); CPU use, flags and errors are the
worst seed's; the per-seed values of the figures
the targets read are kept beside them so the spread is visible.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]
# Figures whose per-seed values the report shows next to the median.
SPREAD = ("ttft_p90_s", "output_tok_s", "success_rate", "hit_rate")
_MEAN = frozenset({"success_rate"})
_KEY = ("contender", "workload", "offered_qps")


def _numeric(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _fold(group: Sequence[Row]) -> dict[str, Any]:
    first = group[0]
    out: dict[str, Any] = {k: v for k, v in first.items() if not _numeric(v) or k in _KEY}
    out["seeds"] = [r.get("seed") for r in group]
    keys = {k for r in group for k, v in r.items() if _numeric(v) and k not in _KEY}
    keys.discard("seed")
    for k in sorted(keys):
        vals = [float(r[k]) for r in group if _numeric(r.get(k))]
        if not vals:
            out[k] = None
            continue
        v = statistics.fmean(vals) if k in _MEAN else statistics.median(vals)
        out[k] = round(v, 6)
    out["by_seed"] = {k: [r.get(k) for r in group] for k in SPREAD}
    # CPU, flags and errors: the worst seed's, so a saturated or contended step stays visible.
    cpus = [r.get("cpu_cores") or {} for r in group]
    names = sorted({k for c in cpus for k in c})
    out["cpu_cores"] = {k: max(c[k] for c in cpus if k in c) for k in names}
    out["cpu_saturated"] = sorted({x for r in group for x in r.get("cpu_saturated") or ()})
    out["contended"] = any(r.get("contended") for r in group)
    errors: dict[str, int] = {}
    for r in group:
        for k, n in (r.get("errors") or {}).items():
            errors[k] = errors.get(k, 0) + int(n)
    out["errors"] = errors
    return out


def fold_seeds(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """One row per contender x workload x load; rows that did not run pass through once."""
    groups: dict[tuple[object, ...], list[Row]] = {}
    passed: list[dict[str, Any]] = []
    seen_down: set[tuple[object, ...]] = set()
    for r in rows:
        key = tuple(r.get(k) for k in _KEY)
        if r.get("status") != "ok":
            if key not in seen_down:
                seen_down.add(key)
                passed.append(dict(r))
            continue
        groups.setdefault(key, []).append(r)
    return [_fold(g) for g in groups.values()] + passed
