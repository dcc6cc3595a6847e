import argparse
import json
from pathlib import Path

import pytest

from benchmarks.routing_bench import cli
from benchmarks.routing_bench.aggregate import fold_seeds
from benchmarks.routing_bench.goodput import Goodput, compute, ladder_goodput, meets, render
from benchmarks.routing_bench.report import render_markdown, write_report

LADDER = (10.0, 20.0, 30.0, 40.0)


def _row(name: str, qps: float, p90: float, ok: float = 1.0, wl: str = "shared_prefix") -> dict:
    return {"contender": name, "workload": wl, "offered_qps": qps, "fleet": "sim",
            "status": "ok", "ttft_p90_s": p90, "success_rate": ok}  # fmt: skip


def _ladder(name: str, p90s: list[float], oks: list[float] | None = None, **kw: object) -> list:
    oks = oks or [1.0] * len(p90s)
    return [{**_row(name, q, t, s), **kw} for q, t, s in zip(LADDER, p90s, oks, strict=False)]


ROWS = [
    # Meets 1 s at every load: the ladder did not find its limit.
    *_ladder("gateway:default", [0.2, 0.3, 0.5, 0.9]),
    # Fails at 30 and passes again at 40: goodput stops at the first failure, 20.
    *_ladder("gateway:round_robin", [0.4, 0.8, 1.5, 0.9]),
    # TTFT fine everywhere but 98% success from 30: 20.
    *_ladder("sglang:cache_aware", [0.3, 0.4, 0.5, 0.6], [1.0, 0.995, 0.98, 1.0]),
    # Never within 1 s; within 2 s up to 20.
    *_ladder("litellm:least-busy", [1.2, 1.8, 2.5, 3.0]),
    # Ran only the two lowest loads (stopped early): the missing rows fail.
    *_ladder("gateway:precise", [0.2, 0.3]),
    {"contender": "vllm-router:cache_aware", "workload": "shared_prefix", "offered_qps": None,
     "fleet": "sim", "status": "unavailable", "reason": "not installed"},
]  # fmt: skip


def _by(found: list[Goodput], slo: float) -> dict[str, Goodput]:
    return {g.contender: g for g in found if g.slo_s == slo}


def test_meets_requires_both_ttft_and_99_percent_success() -> None:
    assert meets(_row("x", 10, 1.0), 1.0)
    assert not meets(_row("x", 10, 1.01), 1.0)
    assert not meets(_row("x", 10, 0.5, ok=0.989), 1.0)
    assert meets(_row("x", 10, 0.5, ok=0.99), 1.0)
    assert not meets({**_row("x", 10, 0.5), "ttft_p90_s": None}, 1.0)
    assert not meets({**_row("x", 10, 0.5), "status": "failed"}, 1.0)


def test_ladder_goodput_stops_at_the_first_failure() -> None:
    at = {float(r["offered_qps"]): r for r in _ladder("x", [0.4, 0.8, 1.5, 0.9])}
    assert ladder_goodput(LADDER, at, 1.0) == 20.0
    assert ladder_goodput(LADDER, at, 2.0) == 40.0
    assert ladder_goodput(LADDER, at, 0.3) == 0.0


def test_goodput_per_contender_at_each_slo() -> None:
    found = compute(ROWS)
    one, two = _by(found, 1.0), _by(found, 2.0)
    assert one["gateway:default"].median == 40.0 and one["gateway:default"].capped
    assert one["gateway:round_robin"].median == 20.0 and not one["gateway:round_robin"].capped
    assert two["gateway:round_robin"].median == 40.0 and two["gateway:round_robin"].capped
    assert one["sglang:cache_aware"].median == 20.0 == two["sglang:cache_aware"].median
    assert one["litellm:least-busy"].median == 0.0
    assert two["litellm:least-busy"].median == 20.0
    assert one["gateway:precise"].median == 20.0 and one["gateway:precise"].top == 40.0
    down = one["vllm-router:cache_aware"]
    assert down.median is None and down.by_seed == {}


def test_several_seeds_give_the_median_and_the_per_seed_range() -> None:
    seed_rows = [
        *({**r, "seed": 0} for r in _ladder("gateway:default", [0.2, 0.3, 0.5, 0.9])),
        *({**r, "seed": 1} for r in _ladder("gateway:default", [0.2, 1.3, 0.5, 0.9])),
        *({**r, "seed": 2} for r in _ladder("gateway:default", [0.2, 0.3, 1.5, 0.9])),
        *({**r, "seed": s} for s in (0, 1, 2) for r in _ladder("sglang:cache_aware", [0.5] * 4)),
    ]
    rows = fold_seeds(seed_rows)
    found = _by(compute(rows, seed_rows), 1.0)
    ours = found["gateway:default"]
    assert ours.by_seed == {0: 40.0, 1: 10.0, 2: 20.0}
    assert ours.median == 20.0 and not ours.capped
    # The folded rows alone (median TTFT per load) would have said 40, no seed's ladder.
    assert _by(compute(rows), 1.0)["gateway:default"].median == 40.0
    md = "\n".join(render(list(found.values()), [1.0], seeds=3))
    assert "| gateway:default | 20 (10 to ≥ 40) · ≤ 0.50x |" in md
    assert "| sglang:cache_aware | ≥ 40 (40 to ≥ 40) · both ≥ top |" in md
    assert "per-seed minimum to maximum" in md


def test_report_starts_with_the_goodput_section(tmp_path: Path) -> None:
    meta = {"fleet": {"fleet": "sim"}, "slos": [1.0, 2.0]}
    md = render_markdown(meta, ROWS, [])
    assert md.index("## Goodput at the SLO") < md.index("## Machine and versions")
    assert md.index("## Goodput at the SLO") < md.index("## Results per workload")
    assert "The figures at every load (TTFT, throughput, success) are in the per-workload" in md
    one = md[md.index("### TTFT p90 <= 1 s") : md.index("### TTFT p90 <= 2 s")]
    assert "| contender | shared_prefix |" in one
    assert "| gateway:default | ≥ 40 · ≥ 2.00x |" in one
    assert "| gateway:round_robin | 20 · 1.00x |" in one
    assert "| litellm:least-busy | none · 0.00x |" in one
    assert "| vllm-router:cache_aware | not run |" in one
    # Ours first, then the peers.
    assert one.index("gateway:round_robin") < one.index("sglang:cache_aware")
    two = md[md.index("### TTFT p90 <= 2 s") :]
    assert "| gateway:round_robin | ≥ 40 · ≥ 2.00x |" in two
    write_report(tmp_path, meta, ROWS, [])
    data = json.loads((tmp_path / "results.json").read_text())
    g = data["goodput"]
    assert g["slos_s"] == [1.0, 2.0] and g["min_success"] == 0.99
    (d,) = [x for x in g["rows"] if x["contender"] == "gateway:default" and x["slo_s"] == 1.0]
    assert d["goodput_qps"] == 40.0 and d["at_top"] is True and d["top_qps"] == 40.0


def test_without_peers_no_ratio_and_a_missing_workload_is_a_dash() -> None:
    rows = [*_ladder("gateway:default", [0.2, 0.3]), _row("gateway:session", 10, 0.2, wl="bimodal")]
    md = "\n".join(render(compute(rows), [1.0]))
    assert "ratio to the best peer" not in md
    assert "| contender | bimodal | shared_prefix |" in md
    assert "| gateway:default | — | ≥ 20 |" in md
    assert "| gateway:session | ≥ 10 | — |" in md


def test_slo_option_reaches_the_config_and_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    cfg = cli.config_from_args(parser.parse_args(["--quick", "--slo", "0.5,1.5"]))
    assert cfg.slos == (0.5, 1.5)
    assert "--slo 0.5,1.5" in cfg.command
    assert cli.config_from_args(parser.parse_args(["--quick"])).slos == (1.0, 2.0)
    for bad in ("x", "1,0"):
        with pytest.raises(ValueError, match="--slo"):
            cli.config_from_args(parser.parse_args(["--slo", bad]))
