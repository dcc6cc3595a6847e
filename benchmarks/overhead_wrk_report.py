"""The wrk harness's maths and report: rows paired to direct, issue 17's targets, report.md."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.wrk_load import WrkResult

DIRECT = "direct"
RUST_PEERS = ("vllm-router:round_robin", "sglang:round_robin")


@dataclass(frozen=True, slots=True)
class WrkRound:
    """One wrk run of one target in one cell, with the target's and nginx's CPU over it."""

    target: str
    concurrency: int
    stream: bool
    round: int
    wrk: WrkResult
    cpu_s: float
    upstream_cpu_s: float
    # wrk's own CPU, and everyone else's on the machine (other engineers' jobs): contention.
    wrk_cpu_s: float = 0.0
    others_cpu_s: float = 0.0
    # CPU the hypervisor gave to other guests while this machine wanted it (/proc/stat steal).
    steal_s: float = 0.0


def _median(values: Sequence[float], digits: int = 3) -> float:
    return round(statistics.median(values), digits) if values else 0.0


def round_figures(r: WrkRound, chunks: int) -> dict[str, float]:
    """The per-round figures that rows take medians of."""
    n = max(r.wrk.requests, 1)
    fig = {
        "rps": r.wrk.rps,
        "p50_ms": r.wrk.p50_s * 1e3,
        "p90_ms": r.wrk.p90_s * 1e3,
        "p99_ms": r.wrk.p99_s * 1e3,
        "max_ms": r.wrk.max_s * 1e3,
        "cpu_us_per_request": r.cpu_s / n * 1e6,
        "upstream_cpu_us_per_request": r.upstream_cpu_s / n * 1e6,
        "cpu_util": r.cpu_s / r.wrk.duration_s if r.wrk.duration_s else 0.0,
        "wrk_cpu_util": r.wrk_cpu_s / r.wrk.duration_s if r.wrk.duration_s else 0.0,
        "others_cpu_util": r.others_cpu_s / r.wrk.duration_s if r.wrk.duration_s else 0.0,
        "steal_util": r.steal_s / r.wrk.duration_s if r.wrk.duration_s else 0.0,
    }
    if r.stream:
        fig["chunks_per_s"] = r.wrk.rps * (chunks + 1)
    return fig


def build_rows(rounds: Sequence[WrkRound], chunks: int) -> list[dict[str, Any]]:
    """One row per (target, concurrency, stream): medians, added figures paired to direct."""
    cells: dict[tuple[str, int, bool], dict[int, WrkRound]] = {}
    order: list[str] = []
    for r in rounds:
        cells.setdefault((r.target, r.concurrency, r.stream), {})[r.round] = r
        if r.target not in order:
            order.append(r.target)
    rows: list[dict[str, Any]] = []
    for (target, conc, stream), by_round in cells.items():
        figs = {i: round_figures(r, chunks) for i, r in by_round.items()}
        dfigs = {
            i: round_figures(r, chunks) for i, r in cells.get((DIRECT, conc, stream), {}).items()
        }
        paired = [i for i in figs if i in dfigs]

        def med(key: str, digits: int = 3, figs: dict[int, dict[str, float]] = figs) -> float:
            return _median([f[key] for f in figs.values()], digits)

        def added(
            key: str,
            figs: dict[int, dict[str, float]] = figs,
            dfigs: dict[int, dict[str, float]] = dfigs,
            paired: list[int] = paired,
        ) -> float:
            return _median([figs[i][key] - dfigs[i][key] for i in paired])

        ratios = [figs[i]["rps"] / dfigs[i]["rps"] for i in paired if dfigs[i]["rps"] > 0]
        rows.append(
            {
                "target": target,
                "concurrency": conc,
                "stream": stream,
                "rounds": len(by_round),
                "requests": sum(r.wrk.requests for r in by_round.values()),
                "errors": sum(r.wrk.errors for r in by_round.values()),
                "rps": med("rps", 1),
                "p50_ms": med("p50_ms"),
                "p90_ms": med("p90_ms"),
                "p99_ms": med("p99_ms"),
                "added_p50_ms": added("p50_ms"),
                "added_p99_ms": added("p99_ms"),
                "rps_ratio_vs_direct": _median(ratios),
                "cpu_us_per_request": med("cpu_us_per_request", 1),
                "upstream_cpu_us_per_request": med("upstream_cpu_us_per_request", 1),
                "cpu_util": med("cpu_util"),
                "wrk_cpu_util": med("wrk_cpu_util"),
                "others_cpu_util": med("others_cpu_util"),
                "steal_util": med("steal_util"),
                "chunks_per_s": med("chunks_per_s", 0) if stream else None,
            }
        )
    rows.sort(key=lambda r: (r["stream"], r["concurrency"], order.index(r["target"])))
    return rows


def _row(rows: Sequence[dict[str, Any]], target: str, conc: int, stream: bool) -> Any:
    return next(
        (r for r in rows if (r["target"], r["concurrency"], r["stream"]) == (target, conc, stream)),
        None,
    )


def evaluate_targets(rows: Sequence[dict[str, Any]], gateway: str) -> list[dict[str, Any]]:
    """Issue 17's goals for the build named `gateway` (value None when its cell did not run)."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, threshold: float | None, at_most: bool) -> None:
        passed = None
        if value is not None and threshold is not None:
            passed = value <= threshold if at_most else value >= threshold
        cmp = "<=" if at_most else ">="
        out.append(
            {
                "name": name,
                "comparison": cmp,
                "threshold": threshold,
                "value": value,
                "passed": passed,
            }
        )

    r64, r1 = _row(rows, gateway, 64, False), _row(rows, gateway, 1, False)
    add("CPU us/request, c=64", r64 and r64["cpu_us_per_request"], 250.0, True)
    add("req/s, c=64", r64 and r64["rps"], 3500.0, False)
    add("added p50 ms, c=1", r1 and r1["added_p50_ms"], 0.35, True)
    rust = [r["p99_ms"] for p in RUST_PEERS if (r := _row(rows, p, 64, False)) is not None]
    # Against the faster Rust router of the run: the stricter reading of "3x the Rust routers'".
    add("p99 ms, c=64, <= 3x the faster Rust router's", r64 and r64["p99_ms"],
        3 * min(rust) if rust else None, True)  # fmt: skip
    streamed = [r["chunks_per_s"] for r in rows if r["target"] == gateway and r["stream"]]
    add("relayed chunks/s, streamed", max(streamed) if streamed else None, 1e5, False)
    return out


_COLUMNS = (
    ("target", "target"), ("concurrency", "c"), ("stream", "stream"), ("rps", "req/s"),
    ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("added_p50_ms", "+p50 ms"),
    ("added_p99_ms", "+p99 ms"), ("rps_ratio_vs_direct", "req/s ÷ direct"),
    ("cpu_us_per_request", "proxy CPU µs/req"), ("cpu_util", "proxy CPU util"),
    ("chunks_per_s", "chunks/s"), ("wrk_cpu_util", "wrk CPU util"),
    ("others_cpu_util", "others' CPU util"), ("steal_util", "steal"), ("errors", "errors"),
)  # fmt: skip


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    return str(v)


def _builds(gateways: list[list[Any]]) -> str:
    """`name (tree, N workers)` for each gateway build of the run."""
    return ", ".join(f"{g[0]} ({g[1]}, {g[2] if len(g) > 2 else 1} worker(s))" for g in gateways)


def markdown(results: dict[str, Any]) -> str:
    """report.md: parameters, the table, the targets."""
    p, m = results["parameters"], results["machine"]
    lines = [
        "# llm-gateway overhead, wrk -> target -> nginx",
        "",
        f"- Machine: {m['cpu_model']}, {m['cpus_usable']} usable CPUs, load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}",
        f"- {p['rounds']} interleaved round(s) of {p['duration_s']} s per target and cell after "
        f"{p['warmup_s']} s warm-up; wrk -t1; {p['stream_chunks']} SSE deltas + [DONE] per "
        "stream, one nginx write each; medians over rounds, `+` = median of per-round "
        "differences against the direct round of the same round. others' CPU util: the "
        "machine's busy CPU (/proc/stat) minus the target's, nginx's, wrk's and this "
        "process's over the round: other jobs sharing the cores (contention); steal: CPU the "
        "hypervisor gave other guests (/proc/stat).",
        f"- Gateway builds: {_builds(p['gateways'])}",
        "",
        "| " + " | ".join(t for _, t in _COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
        *("| " + " | ".join(_cell(r[k]) for k, _ in _COLUMNS) + " |" for r in results["rows"]),
        "",
        "## Peers",
        "",
        *(
            f"- {peer['name']} {peer['version'] or ''}: {peer['status']}"
            for peer in results["peers"]
        ),
        "",
        "## Targets (issue 17)",
        "",
        "| target | goal | measured | result |",
        "|---|---|---|---|",
    ]
    for t in results["targets"]:
        verdict = {True: "pass", False: "**miss**", None: "not measured"}[t["passed"]]
        lines.append(
            f"| {t['name']} | {t['comparison']} {_cell(t['threshold'])} | {_cell(t['value'])} "
            f"| {verdict} |"
        )
    return "\n".join([*lines, ""])
