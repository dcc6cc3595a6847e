"""The wrk harness's maths and report: rows paired to direct, issue 17's targets, report.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.overhead_report import DIRECT as DIRECT  # the harnesses share the name
from benchmarks.overhead_report import base_row, markdown_table, paired_cells, targets_table
from benchmarks.wrk_load import WrkResult

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
    # The target's threads runnable but waiting for a core (all threads summed).
    wait_s: float = 0.0


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
        "runq_wait_util": r.wait_s / r.wrk.duration_s if r.wrk.duration_s else 0.0,
    }
    if r.stream:
        fig["chunks_per_s"] = r.wrk.rps * (chunks + 1)
    return fig


def build_rows(rounds: Sequence[WrkRound], chunks: int) -> list[dict[str, Any]]:
    """One row per (target, concurrency, stream): medians, added figures paired to direct."""
    order = list(dict.fromkeys(r.target for r in rounds))
    rows: list[dict[str, Any]] = []
    cells = paired_cells(rounds, lambda r: round_figures(r, chunks))
    for (target, conc, stream), by_round, p in cells:
        rows.append(
            {
                **base_row((target, conc, stream), [r.wrk for r in by_round.values()], p),
                "p90_ms": p.med("p90_ms"),
                "cpu_util": p.med("cpu_util"),
                "wrk_cpu_util": p.med("wrk_cpu_util"),
                "others_cpu_util": p.med("others_cpu_util"),
                "steal_util": p.med("steal_util"),
                "runq_wait_util": p.med("runq_wait_util"),
                "chunks_per_s": p.med("chunks_per_s", 0) if stream else None,
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
    ("others_cpu_util", "others' CPU util"), ("steal_util", "steal"),
    ("runq_wait_util", "run-queue wait"), ("errors", "errors"),
)  # fmt: skip


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
        "hypervisor gave other guests (/proc/stat); run-queue wait: seconds per second the "
        "target's threads were runnable but had no core (schedstat, all threads summed).",
        f"- Gateway builds: {_builds(p['gateways'])}",
        "",
        markdown_table(results["rows"], _COLUMNS),
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
        *targets_table(results["targets"]),
        "",
    ]
    return "\n".join(lines)
