"""Goodput at a TTFT SLO: the highest offered load a contender serves within the SLO.

Definition (issue 14): on a workload's ladder of offered loads, walked upwards, a load *meets*
the SLO when the contender's row there has TTFT p90 <= SLO and success rate >= 99%. Goodput
is the highest load before the first load that does not meet it: a higher load that passes
again after a failure does not count (a router whose latency recovers past its knee is noise
or luck, not capacity). A missing row on the ladder counts as a failure. Meeting it at no
load gives 0 ("none"); meeting it at the top load gives that load marked "≥ top" (the ladder
did not find the limit). With several seeds, goodput is computed on each seed's rows alone,
then the median and the per-seed range are reported.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.routing_bench.targets import is_ours

Row = Mapping[str, Any]
DEFAULT_SLOS: tuple[float, ...] = (1.0, 2.0)
MIN_SUCCESS = 0.99


@dataclass(frozen=True, slots=True)
class Goodput:
    """One contender's goodput on one workload at one SLO (None: it did not run)."""

    workload: str
    contender: str
    slo_s: float
    median: float | None
    by_seed: dict[int, float]
    capped: bool  # the median reached the ladder's top: its real limit is higher
    top: float | None

    def as_json(self) -> dict[str, Any]:
        seeds = list(self.by_seed.values())
        return {
            "workload": self.workload,
            "contender": self.contender,
            "slo_s": self.slo_s,
            "goodput_qps": self.median,
            "at_top": self.capped,
            "top_qps": self.top,
            "by_seed": {str(s): v for s, v in self.by_seed.items()},
            "min_qps": min(seeds) if seeds else None,
            "max_qps": max(seeds) if seeds else None,
        }


def meets(row: Row, slo_s: float) -> bool:
    """The row ran and kept TTFT p90 within the SLO with >= 99% success."""
    p90, ok = row.get("ttft_p90_s"), row.get("success_rate")
    if row.get("status") != "ok" or p90 is None or ok is None:
        return False
    return float(p90) <= slo_s and float(ok) >= MIN_SUCCESS


def ladder_goodput(ladder: Sequence[float], at: Mapping[float, Row], slo_s: float) -> float:
    """The highest load before the first that fails the SLO (a missing row fails); 0: none."""
    best = 0.0
    for q in sorted(ladder):
        row = at.get(q)
        if row is None or not meets(row, slo_s):
            break
        best = q
    return best


def _by_seed(rows: Sequence[Row]) -> dict[int, list[Row]]:
    out: dict[int, list[Row]] = {}
    for r in rows:
        seed = r.get("seed")
        out.setdefault(seed if isinstance(seed, int) else 0, []).append(r)
    return out


def compute(
    rows: Sequence[Row], seed_rows: Sequence[Row] = (), slos: Sequence[float] = DEFAULT_SLOS
) -> list[Goodput]:
    """Goodput per SLO x workload x contender; per seed from seed_rows when given."""
    # The per-seed rows when there are any: the folded rows' median TTFT of three seeds is no
    # seed's ladder, and the spread is the point of running several.
    source = seed_rows or rows
    ok = [r for r in source if r.get("status") == "ok" and r.get("offered_qps") is not None]
    names = sorted({str(r["contender"]) for r in [*rows, *source]})
    out: list[Goodput] = []
    for wl in sorted({str(r["workload"]) for r in [*rows, *source]}):
        mine = [r for r in ok if r["workload"] == wl]
        ladder = sorted({float(r["offered_qps"]) for r in mine})
        top = ladder[-1] if ladder else None
        seeds = _by_seed(mine)
        for slo in slos:
            for name in names:
                per: dict[int, float] = {}
                for s, got in sorted(seeds.items()):
                    at = {float(r["offered_qps"]): r for r in got if r["contender"] == name}
                    if at:
                        per[s] = ladder_goodput(ladder, at, slo)
                if not per and not any(
                    r["contender"] == name and r["workload"] == wl for r in [*rows, *source]
                ):
                    continue
                med = statistics.median(per.values()) if per else None
                capped = med is not None and med == top
                out.append(Goodput(wl, name, slo, med, per, capped, top))
    return out


def _qps(v: float, capped: bool) -> str:
    if v == 0:
        return "none"
    return f"≥ {v:g}" if capped else f"{v:g}"


def _cell(g: Goodput, peer: Goodput | None) -> str:
    if g.median is None:
        return "not run"
    text = _qps(g.median, g.capped)
    vals = list(g.by_seed.values())
    if len(vals) > 1:
        lo, hi = min(vals), max(vals)
        text += f" ({lo:g} to {'≥ ' if hi == g.top else ''}{hi:g})"
    if peer is not None and peer.median:
        ratio = g.median / peer.median
        if g.capped and peer.capped:
            text += " · both ≥ top"
        else:
            bound = "≥ " if g.capped else "≤ " if peer.capped else ""
            text += f" · {bound}{ratio:.2f}x"
    elif peer is not None and peer.median == 0:
        text += " · best peer none"
    return text


def best_peer(found: Sequence[Goodput], workload: str, slo_s: float) -> Goodput | None:
    """The peer with the highest median goodput on the workload at the SLO (None: no peer ran)."""
    peers = [
        g
        for g in found
        if g.workload == workload
        and g.slo_s == slo_s
        and not is_ours(g.contender)
        and g.median is not None
    ]
    return max(peers, key=lambda g: (g.median or 0.0, g.capped), default=None)


def render(found: Sequence[Goodput], slos: Sequence[float], seeds: int = 1) -> list[str]:
    """The "Goodput at the SLO" section: one table per SLO, contenders x workloads."""
    md = [
        "## Goodput at the SLO",
        "",
        "Goodput: the highest offered load (req/s) of the ladder at which TTFT p90 <= SLO with "
        ">= 99% success, walking up the ladder and stopping at the first load that fails (a "
        "higher load passing again does not count); `none`: no load met it; `≥ X`: it met "
        "the top load X, so the ladder did not find its limit.",
    ]
    if seeds > 1:
        md.append(
            "Computed on each seed alone; the cell is the median, the range in brackets the "
            "per-seed minimum to maximum."
        )
    if any(not is_ours(g.contender) and g.median is not None for g in found):
        md.append(
            "`· r x`: the ratio to the best peer's goodput on that workload (≥ / ≤ where one "
            "side is at the top of the ladder)."
        )
    md += [
        "The figures at every load (TTFT, throughput, success) are in the per-workload tables "
        "below.",
    ]
    workloads = sorted({g.workload for g in found})
    names = sorted({g.contender for g in found}, key=lambda n: (not is_ours(n), n))
    for slo in slos:
        md += ["", f"### TTFT p90 <= {slo:g} s", ""]
        if not workloads:
            md.append("(no rows)")
            continue
        md += ["| contender | " + " | ".join(workloads) + " |", "|---|" + "---|" * len(workloads)]
        cells = {(g.workload, g.contender): g for g in found if g.slo_s == slo}
        peers = {wl: best_peer(found, wl, slo) for wl in workloads}
        for name in names:
            row = [_cell(g, peers[wl]) if (g := cells.get((wl, name))) else "—" for wl in workloads]
            md.append(f"| {name} | " + " | ".join(row) + " |")
    return md


def slos_of(meta: Mapping[str, Any]) -> tuple[float, ...]:
    """The run's SLOs (meta "slos"), else the defaults (results written before issue 14)."""
    given = meta.get("slos")
    return tuple(float(x) for x in given) if given else DEFAULT_SLOS
