"""Turn the overhead benchmark's rounds into rows, targets, results.json and report.md."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from benchmarks.loadgen_http import RoundResult

DIRECT, GATEWAY, GATEWAY_GRPC = "direct", "gateway", "gateway-grpc"
_ORDER = {DIRECT: 0, GATEWAY: 1, GATEWAY_GRPC: 2}  # peers after them, in the order they ran
_STATUS_CHARS = 400


@dataclass(frozen=True, slots=True)
class Measured:
    """One round of one target in one (concurrency, stream) cell."""

    target: str
    concurrency: int
    stream: bool
    round: int
    result: RoundResult


@dataclass(frozen=True, slots=True)
class Target:
    """A pass/fail goal on one figure of one row."""

    name: str
    target: str
    concurrency: int | None
    stream: bool
    field: str
    threshold: float
    at_most: bool
    unit: str


TARGETS = (
    Target("added p50, c=1, non-streamed", GATEWAY, 1, False, "added_p50_ms", 0.5, True, "ms"),
    Target("requests/s, c=64, non-streamed", GATEWAY, 64, False, "rps", 3000.0, False, "req/s"),
    # Any concurrency: the best streamed row is the gateway's relay capacity.
    Target("relayed SSE chunks/s, streamed", GATEWAY, None, True, "chunks_per_s", 5e4, False, "/s"),
)


def _pct(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def round_figures(m: Measured) -> dict[str, float]:
    """The per-round figures that rows take medians of."""
    r = m.result
    lat = sorted(r.latencies_s)
    n = max(r.requests, 1)
    dur = r.duration_s
    fig = {
        "rps": r.requests / dur,
        "p50_ms": _pct(lat, 0.50) * 1e3,
        "p99_ms": _pct(lat, 0.99) * 1e3,
        "cpu_us_per_request": r.cpu_s["gateway"] / n * 1e6,
        "upstream_cpu_us_per_request": r.cpu_s["upstream"] / n * 1e6,
        "loadgen_cpu_us_per_request": r.cpu_s["loadgen"] / n * 1e6,
        "gateway_cpu_util": r.cpu_s["gateway"] / dur,
        "upstream_cpu_util": r.cpu_s["upstream"] / dur,
        "loadgen_cpu_util": r.cpu_s["loadgen"] / dur,
    }
    if m.stream:
        fig["chunks_per_s"] = r.events / dur
        fig["http_chunks_per_s"] = r.http_chunks / dur
        fig["ttfc_p50_ms"] = _pct(sorted(r.ttfc_s), 0.50) * 1e3
    return fig


def median(values: Sequence[float], digits: int = 3) -> float:
    """The median rounded to `digits` (0.0 when empty)."""
    return round(statistics.median(values), digits) if values else 0.0


class _Round(Protocol):
    """What pairing needs of one round of one target in one cell, whichever harness ran it."""

    @property
    def target(self) -> str: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def stream(self) -> bool: ...
    @property
    def round(self) -> int: ...


R = TypeVar("R", bound=_Round)
Cell = tuple[str, int, bool]  # target, concurrency, stream


@dataclass(frozen=True, slots=True)
class Paired:
    """One cell's per-round figures beside those of the direct rounds interleaved with them."""

    figs: dict[int, dict[str, float]]
    direct: dict[int, dict[str, float]]

    def med(self, key: str, digits: int = 3) -> float:
        """The median over rounds of one figure."""
        return median([f[key] for f in self.figs.values()], digits)

    def added(self, key: str) -> float:
        """The median of per-round differences against the direct round of the same round."""
        return median(
            [f[key] - self.direct[i][key] for i, f in self.figs.items() if i in self.direct]
        )

    def rps_ratio(self) -> float:
        """The median of per-round req/s divided by the direct round's."""
        d = self.direct
        return median(
            [f["rps"] / d[i]["rps"] for i, f in self.figs.items() if i in d and d[i]["rps"] > 0]
        )


def paired_cells(
    rounds: Iterable[R], figures: Callable[[R], dict[str, float]]
) -> list[tuple[Cell, dict[int, R], Paired]]:
    """The rounds by cell (first seen first), each cell's figures paired with its direct's."""
    cells: dict[Cell, dict[int, R]] = {}
    for r in rounds:
        cells.setdefault((r.target, r.concurrency, r.stream), {})[r.round] = r
    out: list[tuple[Cell, dict[int, R], Paired]] = []
    for cell, by_round in cells.items():
        direct = cells.get((DIRECT, cell[1], cell[2]), {})
        figs = Paired(
            {i: figures(r) for i, r in by_round.items()}, {i: figures(r) for i, r in direct.items()}
        )
        out.append((cell, by_round, figs))
    return out


class _Counts(Protocol):
    """A round's completed and failed requests, whichever harness counted them."""

    @property
    def requests(self) -> int: ...
    @property
    def errors(self) -> int: ...


def base_row(cell: Cell, results: Sequence[_Counts], p: Paired) -> dict[str, Any]:
    """The figures every harness's row has: the cell, counts summed, medians, paired to direct."""
    target, conc, stream = cell
    return {
        "target": target,
        "concurrency": conc,
        "stream": stream,
        "rounds": len(results),
        "requests": sum(r.requests for r in results),
        "errors": sum(r.errors for r in results),
        "rps": p.med("rps", 1),
        "p50_ms": p.med("p50_ms"),
        "p99_ms": p.med("p99_ms"),
        "added_p50_ms": p.added("p50_ms"),
        "added_p99_ms": p.added("p99_ms"),
        "rps_ratio_vs_direct": p.rps_ratio(),
        "cpu_us_per_request": p.med("cpu_us_per_request", 1),
        "upstream_cpu_us_per_request": p.med("upstream_cpu_us_per_request", 1),
    }


def build_rows(measured: Sequence[Measured]) -> list[dict[str, Any]]:
    """One row per (target, concurrency, stream): medians over rounds, gateway paired to direct."""
    rows: list[dict[str, Any]] = []
    for (target, conc, stream), by_round, p in paired_cells(measured, round_figures):
        results = [m.result for m in by_round.values()]
        row: dict[str, Any] = {
            **base_row((target, conc, stream), results, p),
            "error_kinds": _merge_kinds(r.error_kinds for r in results),
            "loadgen_cpu_us_per_request": p.med("loadgen_cpu_us_per_request", 1),
            "gateway_cpu_util": p.med("gateway_cpu_util"),
            "upstream_cpu_util": p.med("upstream_cpu_util"),
            "loadgen_cpu_util": p.med("loadgen_cpu_util"),
            "chunks_per_s": p.med("chunks_per_s", 0) if stream else None,
            # gRPC has messages, not HTTP/1.1 chunks: its HTTP/2 frames are not counted.
            "http_chunks_per_s": (
                p.med("http_chunks_per_s", 0) if stream and target != GATEWAY_GRPC else None
            ),
            "ttfc_p50_ms": p.med("ttfc_p50_ms") if stream else None,
            "added_ttfc_p50_ms": p.added("ttfc_p50_ms") if stream else None,
        }
        rows.append(row)
    rows.sort(key=lambda r: (r["stream"], r["concurrency"], _ORDER.get(r["target"], 9)))
    return rows


def _merge_kinds(kinds: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in kinds:
        for name, n in k.items():
            out[name] = out.get(name, 0) + n
    return out


def evaluate_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target with its measured value and pass/fail (None when its cell was not run)."""
    out: list[dict[str, Any]] = []
    for t in TARGETS:
        values = [
            r[t.field]
            for r in rows
            if r["target"] == t.target
            and r["stream"] == t.stream
            and (t.concurrency is None or r["concurrency"] == t.concurrency)
        ]
        value = max(values) if values else None
        passed = None
        if value is not None:
            passed = value <= t.threshold if t.at_most else value >= t.threshold
        out.append(
            {
                "name": t.name,
                "field": t.field,
                "threshold": t.threshold,
                "comparison": "<=" if t.at_most else ">=",
                "unit": t.unit,
                "value": value,
                "passed": passed,
            }
        )
    return out


def rounds_json(measured: Sequence[Measured]) -> list[dict[str, Any]]:
    """Every round's own figures, for anyone re-deriving the medians."""
    return [
        {
            "target": m.target,
            "concurrency": m.concurrency,
            "stream": m.stream,
            "round": m.round,
            "requests": m.result.requests,
            "errors": m.result.errors,
            "duration_s": round(m.result.duration_s, 4),
            **{k: round(v, 4) for k, v in round_figures(m).items()},
        }
        for m in measured
    ]


def cell(value: Any) -> str:
    """One table cell: "-" for None, yes/no, floats to three significant figures or so."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


_COLUMNS = (
    ("target", "target"),
    ("concurrency", "c"),
    ("stream", "stream"),
    ("rps", "req/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("added_p50_ms", "+p50 ms"),
    ("added_p99_ms", "+p99 ms"),
    ("rps_ratio_vs_direct", "req/s ÷ direct"),
    ("cpu_us_per_request", "proxy CPU µs/req"),
    ("gateway_cpu_util", "proxy CPU util"),
    ("loadgen_cpu_us_per_request", "client CPU µs/req"),
    ("loadgen_cpu_util", "client CPU util"),
    ("chunks_per_s", "chunks/s"),
    ("http_chunks_per_s", "HTTP chunks/s"),
    ("ttfc_p50_ms", "TTFC p50 ms"),
    ("errors", "errors"),
)


def markdown_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]] = _COLUMNS
) -> str:
    """The rows as one Markdown table of `columns` (row key, title)."""
    lines = [
        "| " + " | ".join(title for _, title in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in rows:
        lines.append("| " + " | ".join(cell(r[key]) for key, _ in columns) + " |")
    return "\n".join(lines)


def targets_table(targets: Sequence[dict[str, Any]]) -> list[str]:
    """The targets as a Markdown table: goal (with its unit, where it has one), value, verdict."""
    lines = ["| target | goal | measured | result |", "|---|---|---|---|"]
    for t in targets:
        verdict = {True: "pass", False: "**miss**", None: "not measured"}[t["passed"]]
        goal = " ".join([t["comparison"], cell(t["threshold"]), *filter(None, [t.get("unit")])])
        lines.append(f"| {t['name']} | {goal} | {cell(t['value'])} | {verdict} |")
    return lines


def write_results(results: dict[str, Any], out: Path, report: str) -> None:
    """results.json and report.md (`report`) under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    (out / "report.md").write_text(report)


def peers_markdown(peers: Sequence[dict[str, Any]]) -> list[str]:
    """The Peers section: every peer asked for, with what became of it (never dropped)."""
    if not peers:
        return []
    lines = [
        "## Peers",
        "",
        "| peer | version | status | SSE events per answer |",
        "|---|---|---|---|",
    ]
    for peer in peers:
        # A start-up failure carries the end of the peer's log: results.json has all of it.
        status = " ".join(peer["status"].split()).replace("|", "/")
        status = status if len(status) <= _STATUS_CHARS else status[: _STATUS_CHARS - 1] + "…"
        lines.append(
            f"| {peer['name']} | {peer['version'] or '-'} | {status} "
            f"| {cell(peer['events_per_answer'])} |"
        )
    return [*lines, ""]


def render_markdown(results: dict[str, Any], schema_doc: str) -> str:
    """report.md: machine, versions, parameters, the table, the targets, the schema."""
    m = results["machine"]
    p = results["parameters"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    parts = [
        "# llm-gateway overhead: direct vs through the gateway and peer routers",
        "",
        f"- Machine: {m['cpu_model']}, {m['cpus_usable']} usable CPUs, {m['platform']}, "
        f"load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}",
        f"- Software: Python {m['python']}, {versions}",
        f"- Parameters: concurrency {', '.join(map(str, p['concurrency']))}; "
        f"{p['rounds']} interleaved round(s) of {p['duration_s']} s per target and cell after "
        f"{p['warmup_s']} s warm-up; {p['stream_chunks']} SSE deltas + [DONE] per stream, "
        f"{p['stream_gap_ms']} ms apart (0 = as fast as the upstream's loop turns); "
        "one gateway process, static upstream and load generator in their own processes; "
        f"gRPC rows: {p['grpc_clients']} grpc.aio client process(es), {p['grpc_channels']} "
        "channels in all.",
        "- The upstream speaks only HTTP, so the direct baseline of the gRPC rows is the direct "
        "HTTP round: their `+` and `÷ direct` columns include the change of protocol (and the "
        "gRPC client's own cost, shown as client CPU µs/req).",
        "- chunks/s: SSE events incl. [DONE] over HTTP (deltas + 1 per answer, or what a peer "
        "relays per answer: see Peers), ChatChunk messages over gRPC (deltas per answer; [DONE] "
        "has no message).",
        "- Peer rows: each peer router started once in front of the same upstream, idle while "
        "the others run, taking its turn in the same interleaved rounds over HTTP/1.1 with the "
        "same client. Its window is stretched to twice its warm-up's wall time (at most 4x) so "
        f"that slow peers finish whole requests in it; LiteLLM runs {p['litellm_rounds']} "
        "round(s) per cell. proxy CPU = the gateway process, or the peer's process(es).",
        "- Figures are medians over rounds; `+` columns are medians of per-round differences "
        "against the direct round it was interleaved with. CPU figures come from "
        "/proc/<pid>/stat (10 ms ticks) of each process over the measuring window.",
        "",
        markdown_table(results["rows"]),
        "",
        *peers_markdown(results["peers"]),
        "## Targets",
        "",
        *targets_table(results["targets"]),
    ]
    parts += ["", "## results.json", "", schema_doc.strip(), ""]
    return "\n".join(parts)
