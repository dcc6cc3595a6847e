"""One tiny replay on the simulated fleet: 2 replicas, direct and our default, both workloads."""

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.replay.ceiling import PromptTokens
from benchmarks.replay.cli import add_arguments, config_from_args, run_replay
from benchmarks.replay.report import FIELDS
from benchmarks.replay.workloads import build

# A row's fields that may be null on an ok row: no error, or nothing to say.
_MAY_BE_NULL = {"reason", "others_cpu_s"}


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.timeout(90)
async def test_tiny_replay_reads_the_replicas_counters_and_writes_every_field(
    tmp_path: Path,
) -> None:
    argv = "--fleet sim --replicas 2 --in-flight 2 --rounds 0 --time-scale 4"
    argv += " --contenders direct,gateway:default,placed:default"
    argv += " --param multi_round_chat.users=4"
    argv += " --param multi_round_chat.turns=3 --param long_prefixes.groups=4"
    argv += " --param long_prefixes.turns=2"
    cfg = config_from_args(_args(*argv.split(), "--out", str(tmp_path)))
    rows, report = await run_replay(cfg)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [(r["workload"], r["contender"]) for r in data["rows"]] == [
        (w, c) for w in ("multi_round_chat", "long_prefixes")
        for c in ("direct", "gateway:default", "placed:default")
    ]  # fmt: skip
    for r in data["rows"]:
        assert r["status"] == "ok", r
        missing = [k for k in FIELDS if r.get(k) is None and k not in _MAY_BE_NULL]
        assert not missing, (r["contender"], missing)
        n = 12 if r["workload"] == "multi_round_chat" else 16
        assert r["requests"] == r["succeeded"] == n
        # The replicas' own counters: every request finished on one of them, and hit.
        assert sum(r["replica_requests"]) == n and len(r["shares"]) == 2
        assert 0.0 < r["hit_rate"] <= r["ceiling"] + 1e-9 <= 1.0
        assert r["ceiling_as_sent"] == pytest.approx(r["ceiling"], abs=0.05)
        assert r["replica_cpu_s"] > 0 and r["wall_s"] > 0
        assert 1.0 <= r["busy_replicas"] <= 2.0 and 1.0 <= r["per_busy_replica"] <= 2.0
    # Our gateway answered a probe before its replay; direct needs none.
    assert [(r["probes"] >= 1, r["ready_s"] >= 0) for r in data["rows"][:3]] == [
        (False, True), (True, True), (False, True),
    ]  # fmt: skip
    # placed:default replays the gateway's placement: each replica served the same requests.
    for i in (0, 3):
        gw, placed = data["rows"][i + 1], data["rows"][i + 2]
        assert placed["replica_requests"] == gw["replica_requests"]
    direct = data["rows"][3]
    # Direct placement by group: groups 0 and 2 on replica 0, 1 and 3 on replica 1.
    assert direct["replica_requests"] == [8, 8] and direct["cpu_vs_direct"] == 1.0
    # A group's conversations on one replica: near the ceiling (two of a group's turns may
    # run at once, the second before the first's prompt is cached: a timing, not a placement).
    assert direct["hit_rate"] >= direct["ceiling"] - 0.1
    meta = data["meta"]
    kv = meta["workloads"]["long_prefixes"]["kv"]
    assert 0.6 <= kv["working_set_vs_fleet_kv"] <= 0.7 and kv["replicas"] == 2
    assert meta["fleet"] == {"kind": "sim", "replicas": 2, "block_size": 16,
                             "model": "sim-llama-3-8b"}  # fmt: skip
    assert "--rounds=0" in meta["command"] and meta["rounds"] == [0]
    assert [c["verdict"] for c in data["checks"]].count("NOT EVALUATED") == 0
    assert len(data["checks"]) == 6
    md = report.read_text()
    assert "## Done when" in md and "working set" in md
    # The ceiling's tokens are the replica's: the simulator's own prompt token counts.
    codec = PromptTokens(None)
    want = {i.req.rid: len(codec.ids(i.req)) for i in build(cfg.specs["long_prefixes"], 0, 32)}
    raw = tmp_path / "raw" / "long_prefixes-r0-gateway_default.jsonl"
    recs = [json.loads(x) for x in raw.read_text().splitlines()]
    assert {r["rid"]: r["prompt_tokens"] for r in recs} == want
    assert len(rows) == 6
    placed_raw = tmp_path / "raw" / "long_prefixes-r0-placed_default.jsonl"
    placed_recs = [json.loads(x) for x in placed_raw.read_text().splitlines()]
    assert {r["rid"]: r["replica"] for r in placed_recs} == {r["rid"]: r["replica"] for r in recs}


def test_bad_options_fail_before_any_fleet_starts() -> None:
    for argv in (
        ["--workloads", "nope"],
        ["--contenders", "direct,bogus"],
        ["--rounds", "a"],
        ["--rounds", "1,1"],
        ["--in-flight", "0"],
        ["--param", "long_prefixes.nope=1"],
    ):
        with pytest.raises(ValueError):
            config_from_args(_args(*argv))


def test_registered_as_llm_gateway_bench_replay() -> None:
    from gateway.cli import build_parser

    argv = ["bench", "replay", "--fleet", "sim", "--rounds", "3", "--param", "x.y=1"]
    args = build_parser(argv).parse_args(argv)
    assert (args.fleet, args.rounds, args.param, args.in_flight) == ("sim", "3", ["x.y=1"], 4)
    assert args.contenders.split(",")[:2] == ["direct", "gateway:default"]
