"""Shares, hit rate, the "Done when" checks, the report, the contenders and the workloads."""

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.replay import measure
from benchmarks.replay.checks import all_passed, evaluate
from benchmarks.replay.colocation import colocation
from benchmarks.replay.contenders import Direct, Placed, PlacementMissing, resolve
from benchmarks.replay.report import FIELDS, render_markdown, write_report
from benchmarks.replay.runner import add_cpu_ratio
from benchmarks.replay.workloads import (
    SPECS,
    ChatSpec,
    LongPrefixSpec,
    ReplayWorkloadError,
    chat_items,
    long_prefix_items,
    with_params,
)
from benchmarks.routing_bench.contenders import FleetInfo
from benchmarks.routing_bench.fleet import HITS, QUERIES, SUCCESS, parse_metrics
from benchmarks.routing_bench.gateway_contender import GatewayContender, GatewayMode


def test_shares_and_their_max_min_ratio() -> None:
    assert measure.shares([30, 10]) == [0.75, 0.25]
    assert measure.max_min_share([0.75, 0.25]) == 3.0
    assert measure.max_min_share(measure.shares([10, 10, 10, 10])) == 1.0
    # A replica that served nothing has no finite ratio; no requests at all: no shares.
    assert measure.max_min_share(measure.shares([0, 5])) is None
    assert measure.shares([0, 0]) is None and measure.max_min_share(None) is None


def test_hit_rate_and_shares_come_from_counter_deltas_summed_over_replicas() -> None:
    text = (
        'vllm:request_success_total{finished_reason="length",engine="0"} 3.0\n'
        'vllm:request_success_total{finished_reason="stop",engine="0"} 2.0\n'
        "vllm:prefix_cache_hits_total 40.0\nvllm:prefix_cache_queries_total 100.0\n"
    )
    after = [parse_metrics(text, measure.COUNTERS), parse_metrics(text, measure.COUNTERS)]
    assert after[0][SUCCESS] == 5.0  # summed over its label sets
    before = [{**after[0], HITS: 0.0, QUERIES: 0.0, SUCCESS: 1.0}, dict.fromkeys(after[1], 0.0)]
    assert measure.deltas(before, after, SUCCESS) == [4.0, 5.0]
    assert measure.hit_rate(before, after) == 0.4
    assert measure.hit_rate(after, after) is None  # no queries: no rate


def _row(contender: str, **kw: Any) -> dict[str, Any]:
    base = {"contender": contender, "workload": "w", "round": 0, "status": "ok"}
    base.update(hit_rate=0.80, ceiling=0.805, shares=[0.5, 0.5], max_min_share=1.0)
    base.update(replica_cpu_s=10.0)
    return {**base, **kw}


def test_checks_pass_at_the_limits_and_fail_past_them() -> None:
    rows = [_row("direct"), _row("gateway:default", hit_rate=0.795, replica_cpu_s=10.5)]
    rows[1].update(shares=[0.6, 0.4], max_min_share=1.5)
    checks = evaluate(rows)
    assert [c.verdict for c in checks] == ["PASS", "PASS", "PASS"]
    assert all_passed(checks)
    rows[1].update(hit_rate=0.79, max_min_share=1.51, replica_cpu_s=10.6)
    checks = evaluate(rows)
    assert [c.verdict for c in checks] == ["FAIL", "FAIL", "FAIL"]
    assert not all_passed(checks)
    assert "FAIL w round 0: replicas' CPU <= 1.05x direct" in checks[2].line()


def test_a_replica_with_no_requests_fails_and_missing_rows_are_not_evaluated() -> None:
    rows = [_row("gateway:default", shares=[1.0, 0.0], max_min_share=None)]
    share, cpu = evaluate(rows)[1:]
    assert share.verdict == "FAIL" and "served none" in share.detail
    assert cpu.verdict == "NOT EVALUATED" and "no direct row" in cpu.detail
    failed = [_row("direct"), {**_row("gateway:default"), "status": "failed", "reason": "boom"}]
    assert {c.verdict for c in evaluate(failed)} == {"NOT EVALUATED"}
    assert not all_passed(evaluate(failed)) and not all_passed([])
    # Per workload and round: each gets its own three checks.
    two = [_row("direct"), _row("gateway:default"), _row("direct", round=1)]
    assert [(c.round, c.verdict) for c in evaluate(two)][3:] == [(1, "NOT EVALUATED")] * 3


def test_cpu_ratio_is_against_direct_in_the_same_round() -> None:
    rows = [_row("direct", replica_cpu_s=8.0), _row("x", replica_cpu_s=12.0)]
    rows.append(_row("x", round=1, replica_cpu_s=5.0))
    add_cpu_ratio(rows)
    assert [r["cpu_vs_direct"] for r in rows] == [1.0, 1.5, None]


def test_report_shows_every_row_and_every_fail(tmp_path: Path) -> None:
    rows = [_row("direct"), _row("gateway:default", hit_rate=0.5)]
    rows.append({"contender": "sglang:cache_aware", "workload": "w", "round": 0,
                 "status": "unavailable", "reason": "not installed"})  # fmt: skip
    checks = evaluate(rows)
    meta = {"command": "llm-gateway bench replay", "fleet": {"kind": "sim"}, "rounds": [0]}
    meta["workloads"] = {"w": {"params": {"users": 2}, "kv": {"working_set_blocks": 7}}}
    path = write_report(tmp_path, meta, rows, checks)
    md = path.read_text()
    assert "FAIL w round 0: hit rate >= ceiling - 0.01" in md
    assert "UNAVAILABLE: not installed" in md and "SIMULATED" in md
    assert "working set 7 blocks" in md
    data = json.loads((tmp_path / "results.json").read_text())
    assert all(set(FIELDS) <= set(r) for r in data["rows"])
    assert [c["verdict"] for c in data["checks"]] == ["FAIL", "PASS", "PASS"]
    assert render_markdown(meta, rows, []).count("| 0 |") == 3


def test_contenders_by_name_with_peer_aliases_and_variants() -> None:
    got = resolve(["direct", "gateway:default", "sglang-router:cache_aware", "vllm-router:x"])
    assert [c.name for c in got] == [
        "direct", "gateway:default", "sglang:cache_aware", "vllm-router:x",
    ]  # fmt: skip
    assert getattr(got[3], "policy", None) == "x"
    extra = (GatewayMode("slow", "default", False, "[score_loop]\n"),)
    assert [c.name for c in resolve(["direct"], extra)] == ["direct", "gateway:slow"]
    for bad in (["nope"], ["gateway:nope"], ["direct", "direct"], ["sglang-router"]):
        with pytest.raises(ValueError):
            resolve(bad)


async def test_direct_places_by_group_modulo_the_replicas() -> None:
    d = Direct()
    await d.start(FleetInfo(("http://a", "http://b"), "m", (None, None), None, 16, "sim"))
    items = long_prefix_items(LongPrefixSpec(groups=3, users=1, turns=1), 0, 8)
    assert sorted((i.place, d.url_for(i)) for i in items) == [
        (0, "http://a"), (1, "http://b"), (2, "http://a"),
    ]  # fmt: skip


def test_long_prefixes_shape() -> None:
    items = long_prefix_items(LongPrefixSpec(), 0, 32)
    assert len(items) == 120 and all(i.req.max_tokens == 32 for i in items)
    by_conv: dict[str, list[int]] = {}
    systems: dict[int, set[str]] = {}
    for i in items:
        by_conv.setdefault(i.conv, []).append(i.turn)
        systems.setdefault(i.place, set()).add(i.req.messages[0][1])
        assert len(i.req.messages) == 2 * i.turn + 2  # system, then user/assistant pairs
    assert len(by_conv) == 40 and all(t == [0, 1, 2] for t in by_conv.values())
    assert len(systems) == 20 and all(len(s) == 1 for s in systems.values())
    assert len({next(iter(s)) for s in systems.values()}) == 20
    # Round 1 is other text of the same shape.
    assert long_prefix_items(LongPrefixSpec(), 1, 32)[0].req != items[0].req


def test_chat_is_users_times_turns_each_turn_extending_the_last() -> None:
    items = chat_items(ChatSpec(), 0, 32)
    assert len(items) == 288 and {i.place for i in items} == set(range(72))
    first, second = items[0], items[72]
    assert first.conv == second.conv == "u0" and (first.turn, second.turn) == (0, 1)
    assert second.req.messages[: len(first.req.messages)] == first.req.messages


def test_params_set_sizes_and_refuse_typos() -> None:
    specs = with_params(SPECS, ["multi_round_chat.users=5", "long_prefixes.turns=2"])
    assert specs["multi_round_chat"] == ChatSpec(users=5)
    assert specs["long_prefixes"] == LongPrefixSpec(turns=2)
    for bad in ("multi_round_chat.nope=1", "nope.users=1", "long_prefixes.users=0",
                "long_prefixes.users=x", "long_prefixes.users"):  # fmt: skip
        with pytest.raises(ReplayWorkloadError):
            with_params(SPECS, [bad])


def test_placed_needs_its_gateway_first_and_a_placement_for_every_request() -> None:
    got = resolve(["gateway:default", "placed:default"])
    placed = got[1]
    assert isinstance(placed, Placed) and placed.source == "gateway:default"
    # Every gateway contender logs its placements.
    assert all(c.mode.request_log for c in got if isinstance(c, GatewayContender))
    for bad in (["placed:default"], ["placed:default", "gateway:default"], ["placed:nope"]):
        with pytest.raises(ValueError, match="must come after"):
            resolve(bad)
    items = long_prefix_items(LongPrefixSpec(groups=2, users=1, turns=1), 0, 8)
    with pytest.raises(PlacementMissing, match="placed 1 of 2"):
        placed.use({items[0].req.rid: 1}, items)
    placed.use({items[0].req.rid: 1, items[1].req.rid: 0}, items)
    assert [placed.replica_for(it) for it in items] == [1, 0]


def test_colocation_weights_time_and_needs_every_placement() -> None:
    recs = [
        {"sent": 0.0, "ended": 2.0, "replica": 0},
        {"sent": 0.0, "ended": 1.0, "replica": 0},  # with the first: 2 on one replica for 1 s
        {"sent": 1.0, "ended": 2.0, "replica": 1},  # then 2 replicas, one each, for 1 s
        {"sent": 3.0, "ended": 4.0, "replica": 1},  # a gap nothing ran in counts for nothing
    ]
    assert colocation(recs) == {"busy_replicas": 1.333, "per_busy_replica": 1.25}
    # Back to back on one replica: the end and the next send at one instant never overlap.
    chain = [{"sent": 0.0, "ended": 1.0, "replica": 0}, {"sent": 1.0, "ended": 2.0, "replica": 0}]
    assert colocation(chain) == {"busy_replicas": 1.0, "per_busy_replica": 1.0}
    unknown = [*recs, {"sent": 0.0, "ended": 1.0, "replica": None}]
    assert colocation(unknown) == {"busy_replicas": None, "per_busy_replica": None}
    assert colocation([]) == {"busy_replicas": None, "per_busy_replica": None}
