"""results.json and report.md of a routing benchmark run."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.routing_bench import goodput
from benchmarks.routing_bench.targets import best_by_seed, best_profile, evaluate, top_load

REQUIRED = (
    "contender",
    "workload",
    "offered_qps",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p99_s",
    "output_tok_s",
    "success_rate",
    "hit_rate",
    "imbalance",
    "fleet",
)
_COLUMNS = (
    ("QPS", "offered_qps", "{:g}"),
    ("n", "requests", "{:.0f}"),
    ("TTFT p50", "ttft_p50_s", "{:.3f}"),
    ("p90", "ttft_p90_s", "{:.3f}"),
    ("p99", "ttft_p99_s", "{:.3f}"),
    ("ITL p50 ms", "itl_p50_s", "ms"),
    ("ITL p99 ms", "itl_p99_s", "ms"),
    ("e2e p50", "e2e_p50_s", "{:.2f}"),
    ("out tok/s", "output_tok_s", "{:.0f}"),
    ("success", "success_rate", "{:.1%}"),
    ("hit rate", "hit_rate", "{:.1%}"),
    ("imbalance", "imbalance", "{:.2f}"),
    ("preempt", "preemptions", "{:.0f}"),
)


def _fmt(v: Any, f: str) -> str:
    if v is None:
        return "—"
    if f == "ms":
        return f"{v * 1000:.1f}"
    return f.format(v)


def _cpu(row: Mapping[str, Any]) -> str:
    c = row.get("cpu_cores") or {}
    keys = ("fleet", "contender", "loadgen", "others")
    return "/".join(f"{c[k]:.2f}" if k in c else "—" for k in keys)


def _table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    head = [
        "contender",
        *(c[0] for c in _COLUMNS),
        "CPU fleet/router/loadgen/others",
        "lag p99 ms",
        "flags",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        flags = []
        if r.get("cpu_saturated"):
            flags.append("CPU-SATURATED: " + ",".join(r["cpu_saturated"]))
        if r.get("contended"):
            flags.append("CONTENDED")
        if r.get("errors"):
            flags.append("; ".join(f"{k} x{v}" for k, v in r["errors"].items()))
        cells = [
            str(r["contender"]),
            *(_fmt(r.get(k), f) for _, k, f in _COLUMNS),
            _cpu(r),
            _fmt(r.get("send_lag_p99_ms"), "{:.1f}"),
            " ".join(flags),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _all_failed(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Contenders that ran but never completed a request, with their error kinds."""
    ran: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("status") == "ok":
            ran.setdefault(str(r["contender"]), []).append(r)
    out = {}
    for name, mine in ran.items():
        if all(not r.get("success_rate") for r in mine):
            kinds: dict[str, int] = {}
            for r in mine:
                for k, v in (r.get("errors") or {}).items():
                    kinds[k] = kinds.get(k, 0) + v
            out[name] = ", ".join(f"{k} x{v}" for k, v in kinds.items()) or "no answer"
    return out


def write_results(
    path: Path,
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    seed_rows: Sequence[Mapping[str, Any]] = (),
) -> None:
    """results.json: {"meta", "goodput", "rows", "seed_rows"}; every required key on every row.

    rows: one per contender x workload x load, folded over seeds (benchmarks.routing_bench
    .aggregate); seed_rows: the per-seed rows they were folded from.
    """
    full = [{**{k: None for k in REQUIRED}, **r} for r in rows]
    slos = goodput.slos_of(meta)
    found = goodput.compute(rows, seed_rows, slos)
    data = {
        "meta": meta,
        "goodput": {
            "slos_s": list(slos),
            "min_success": goodput.MIN_SUCCESS,
            "rows": [g.as_json() for g in found],
        },
        "rows": full,
        "seed_rows": list(seed_rows),
    }
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def render_markdown(
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    plots: Sequence[str],
    seed_rows: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The Markdown report: goodput, machine, parameters, targets, tables per workload, plots."""
    sim = meta.get("fleet", {}).get("fleet") == "sim"
    tag = " (simulated)" if sim else ""
    md = [f"# Routing benchmark{tag}: {meta.get('date', '')}", ""]
    if sim:
        md += [
            "**Every figure in this report comes from a simulated vLLM fleet** (simulator: "
            "vLLM's HTTP surface and metrics, a calibrated step-time model of an 8B model on one "
            "H100, scaled down); read them as simulated, not measured on GPUs.",
            "",
        ]
    if meta.get("note"):
        md += [f"Note: {meta['note']}", ""]
    slos = goodput.slos_of(meta)
    n_seeds = len({r.get("seed") for r in seed_rows if r.get("status") == "ok"})
    md += [*goodput.render(goodput.compute(rows, seed_rows, slos), slos, n_seeds), ""]
    md += ["## Machine and versions", ""]
    for k, v in (meta.get("machine") or {}).items():
        md.append(f"- {k}: {v}")
    md += ["", "## Parameters and seeds", "", f"- command: `{meta.get('command', '')}`"]
    seeds = meta.get("seeds") or [meta.get("seed")]
    md.append(
        f"- seeds: {', '.join(str(x) for x in seeds)} (workload content, arrival times; the same "
        "for every contender); each figure is the median over seeds (success rate: the mean)"
    )
    md.append(f"- fleet: {json.dumps(meta.get('fleet'))}")
    md.append(f"- plan: {json.dumps(meta.get('plan'))}")
    for wl, p in (meta.get("workloads") or {}).items():
        md.append(f"- workload `{wl}`: {json.dumps(p)}")
    md += ["", "## Targets (issue 6)" + tag, ""]
    for t in evaluate(rows):
        where = f"{t.workload} @ {t.offered_qps:g} req/s" if t.offered_qps else t.workload
        md.append(f"- {t.name} [{where}]: {t.describe()}")
    best, scores = best_profile(rows)
    if best is not None:
        ranked = ", ".join(f"{n} {s:.2f}" for n, s in sorted(scores.items(), key=lambda x: x[1]))
        md += [
            "",
            f"Best of our profiles overall{tag}: **{best}** (mean TTFT p90 relative to "
            f"the best of ours per workload at its top load; lower is better: {ranked}).",
        ]
        md += _ranking_by_seed(rows, seed_rows)
    md += _spread(rows)
    dead = _all_failed(rows)
    if dead:
        md += ["", "## Contenders whose every request failed", ""]
        md += [f"- {n}: {errs}" for n, errs in dead.items()]
    down = [r for r in rows if r.get("status") != "ok"]
    if down:
        md += ["", "## Contenders that did not run", ""]
        seen: set[tuple[str, str]] = set()
        for r in down:
            key = (str(r["contender"]), str(r.get("reason")))
            if key not in seen:
                seen.add(key)
                md.append(f"- {r['contender']} ({r.get('status')}): {r.get('reason')}")
    md += [
        "",
        "## Results per workload" + tag,
        "",
        "TTFT and e2e in seconds; ITL per token; hit rate from the replicas' own "
        "`vllm:prefix_cache_hits_total / queries_total` deltas over the step; imbalance = "
        "mean over samples of std/mean of per-replica `vllm:num_requests_running`; preempt = "
        "the replicas' `vllm:num_preemptions_total` delta over the step; CPU in "
        "cores per process group over the step (flagged above "
        "0.9 of a core); lag = load generator's actual minus scheduled send time.",
        "",
    ]
    for wl in sorted({str(r["workload"]) for r in rows}):
        mine = sorted(
            (r for r in rows if r["workload"] == wl and r.get("status") == "ok"),
            key=lambda r: (float(r["offered_qps"]), str(r["contender"])),
        )
        md += [f"### {wl}{tag}", ""]
        md += _table(mine) if mine else ["(no contender ran this workload)"]
        md += [f"![{Path(p).stem}]({p})" for p in plots if Path(p).name.startswith(wl + "_")]
        md.append("")
    sat = [r for r in rows if r.get("cpu_saturated")]
    busy = [r for r in rows if r.get("contended")]
    md += ["## CPU saturation and contention", ""]
    md.append(
        f"{len(sat)} run step(s) had a CPU-saturated process: the figures of those steps measure "
        "the machine, not the router."
        if sat
        else "No benchmark process (fleet, router, load generator) was CPU-saturated in any step."
    )
    md.append(
        f"{len(busy)} of {len(rows)} step(s) are flagged CONTENDED: processes outside the "
        "benchmark used more than 0.5 cores during them (the machine is shared), so their "
        "latencies may include waiting for the CPU."
    )
    md.append("")
    return "\n".join(md)


def _ranking_by_seed(
    rows: Sequence[Mapping[str, Any]], seed_rows: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The same ranking on each seed alone, and which profiles the seeds cannot tell apart."""
    per = best_by_seed(rows, seed_rows)
    if len(per) < 2:
        return []
    md = ["", "The same ranking on each seed alone:", ""]
    for s, (best, scores) in per.items():
        top = sorted(scores.items(), key=lambda x: x[1])[:3]
        md.append(f"- seed {s}: **{best}** (" + ", ".join(f"{n} {v:.2f}" for n, v in top) + ")")
    winners = sorted({b for b, _ in per.values() if b is not None})
    if len(winners) > 1:
        md += [
            "",
            f"{' and '.join(winners)} each rank first on at least one seed: the difference "
            "between them is inside the seed spread, so this run ranks them as tied.",
        ]
    return md


def _spread(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per-seed values at the load the targets read, for the prefix-sharing workloads."""
    return [*_spread_of(rows, "shared_prefix"), *_spread_of(rows, "skewed_prefix")]


def _spread_of(rows: Sequence[Mapping[str, Any]], workload: str) -> list[str]:
    qps = top_load(rows, workload)
    at = [
        r
        for r in rows
        if r.get("workload") == workload and r.get("offered_qps") == qps and r.get("by_seed")
    ]
    if not at or len(at[0]["seeds"]) < 2:
        return []
    md = [
        "",
        f"Per seed ({workload} @ {qps:g} req/s; seeds {at[0]['seeds']}):",
        "",
        "| contender | TTFT p90 s | output tok/s | success | hit rate |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(at, key=lambda r: str(r["contender"])):
        b = r["by_seed"]
        cells = [
            " / ".join(_fmt(v, f) for v in b.get(k) or ())
            for k, f in (
                ("ttft_p90_s", "{:.2f}"),
                ("output_tok_s", "{:.0f}"),
                ("success_rate", "{:.1%}"),
                ("hit_rate", "{:.1%}"),
            )
        ]
        md.append(f"| {r['contender']} | " + " | ".join(cells) + " |")
    return md


def write_report(
    out: Path,
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    plots: Sequence[str],
    seed_rows: Sequence[Mapping[str, Any]] = (),
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_results(out / "results.json", meta, rows, seed_rows)
    (out / "report.md").write_text(render_markdown(meta, rows, plots, seed_rows))


def rerender(out: Path) -> None:
    """Rewrite report.md from an output folder's results.json (e.g. after a report change)."""
    data = json.loads((out / "results.json").read_text())
    plots = sorted(p.name for p in out.glob("*.png"))
    md = render_markdown(data["meta"], data["rows"], plots, data.get("seed_rows") or ())
    (out / "report.md").write_text(md)


if __name__ == "__main__":
    import sys

    rerender(Path(sys.argv[1]))
