import itertools

import pytest

from benchmarks.routing_bench.workloads import (
    WORKLOADS,
    FleetSize,
    WorkloadError,
    make_workload,
)
from vllm_api.tokenizer import BuiltinTokenizer

SIZE = FleetSize(replicas=8, blocks_per_replica=1024, block_size=16)
TOK = BuiltinTokenizer()


def _take(name: str, seed: int, n: int = 60) -> list:
    return list(itertools.islice(make_workload(name, SIZE, seed).requests(), n))


def _tokens(text: str) -> int:
    return len(TOK.encode(text))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_same_seed_same_traffic_other_seed_other_traffic(name: str) -> None:
    assert _take(name, 3) == _take(name, 3)
    assert make_workload(name, SIZE, 3).warmup == make_workload(name, SIZE, 3).warmup
    assert [r.messages for r in _take(name, 3)] != [r.messages for r in _take(name, 4)]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_sessions_of_one_seed_are_not_another_seeds(name: str) -> None:
    # One gateway process serves every seed of a run: a session id seen again under another
    # seed would carry the first seed's placement into traffic that shares none of its prompts.
    sessions = [{r.session for r in _take(name, seed, 200)} - {None} for seed in (0, 1)]
    assert not sessions[0] & sessions[1]


@pytest.mark.parametrize("name", ["shared_prefix", "generated_shared_prefix", "multi_round_chat"])
def test_working_set_is_70pct_of_fleet_and_several_replicas(name: str) -> None:
    wl = make_workload(name, SIZE, 0)
    assert 0.65 <= wl.working_set_tokens / SIZE.fleet_tokens <= 0.75
    assert wl.working_set_tokens / SIZE.replica_tokens >= 5


def test_shared_prefix_sizes_and_sharing() -> None:
    wl = make_workload("shared_prefix", SIZE, 0, {"prefix": 1000, "question": 50, "output": 32})
    groups = wl.params["groups"]
    assert groups == round(0.7 * SIZE.fleet_tokens / 1000)
    # Warm-up touches every group exactly once.
    assert sorted(r.group for r in wl.warmup) == sorted(f"g{g}" for g in range(groups))
    reqs = list(itertools.islice(wl.requests(), 400))
    for r in reqs[:20]:
        (role_s, system), (role_u, question) = r.messages
        assert (role_s, role_u) == ("system", "user")
        assert _tokens(system) == 1000 and _tokens(question) == 50
        assert r.max_tokens == 32 and r.body("m")["ignore_eos"] is True
    systems = {r.messages[0][1] for r in reqs}
    assert systems <= {r.messages[0][1] for r in wl.warmup}  # only the groups' own prompts
    assert len(systems) >= 0.9 * groups
    per_group = {r.group: r.messages[0][1] for r in reqs}
    assert len(per_group) == len(systems)  # one prompt per group, shared by all its requests
    assert len({r.messages[1][1] for r in reqs}) == len(reqs)  # every question is fresh
    # Sharing ratio: the shared prefix is most of every prompt.
    assert 1000 / (1000 + 50) > 0.9


def test_generated_shared_prefix_cycles_fixed_prompts() -> None:
    wl = make_workload(
        "generated_shared_prefix", SIZE, 0, {"groups": 4, "per_group": 3, "prefix": 64}
    )
    reqs = list(itertools.islice(wl.requests(), 24))
    first, second = reqs[:12], reqs[12:]
    assert len({r.messages for r in first}) == 12  # each prompt once per cycle
    assert {r.messages for r in first} == {r.messages for r in second}
    assert [r.messages for r in first] != [r.messages for r in second]  # reshuffled


def test_multi_round_chat_carries_the_whole_history() -> None:
    wl = make_workload("multi_round_chat", SIZE, 0, {"users": 3, "turns": 4, "system": 40})
    assert [len(r.messages) for r in wl.warmup] == [2, 2, 2]
    reqs = list(itertools.islice(wl.requests(), 12))
    by_user: dict[str, list] = {}
    for r in wl.warmup + reqs:
        by_user.setdefault(r.group, []).append(r)
    for turns in by_user.values():
        assert [len(t.messages) for t in turns] == [2, 4, 6, 8, 2]  # restarts after 4 turns
        for prev, nxt in itertools.pairwise(turns[:4]):
            assert nxt.messages[: len(prev.messages)] == prev.messages
            assert nxt.session == prev.session
    assert len({r.messages[0] for r in reqs}) == 1  # one system prompt for everyone


def test_low_sharing_prompts_share_nothing() -> None:
    reqs = _take("low_sharing", 0, 50)
    assert len({r.messages[0][1][:40] for r in reqs}) == 50
    assert all(_tokens(r.messages[0][1]) == 512 for r in reqs[:5])


def test_bimodal_mix() -> None:
    reqs = _take("bimodal", 1, 2000)
    long = [r for r in reqs if r.max_tokens == 256]
    assert 0.08 <= len(long) / len(reqs) <= 0.12
    assert _tokens(long[0].messages[0][1]) == 2048
    short = next(r for r in reqs if r.max_tokens == 64)
    assert _tokens(short.messages[0][1]) == 128


def test_unknown_workload_or_parameter() -> None:
    with pytest.raises(WorkloadError, match="unknown workload"):
        make_workload("nope", SIZE, 0)
    with pytest.raises(WorkloadError, match="shared_prefix"):
        make_workload("shared_prefix", SIZE, 0, {"bogus": 1})


def test_body_streams_with_usage_and_no_user_field() -> None:
    # The session travels in the x-session-id header: LiteLLM answers 400 to a body `user`
    # when it has no database to track end users in.
    body = _take("shared_prefix", 0, 1)[0].body("sim")
    assert "user" not in body and body["stream_options"] == {"include_usage": True}


def test_skewed_prefix_follows_zipf_over_the_same_groups() -> None:
    from collections import Counter

    wl = make_workload("skewed_prefix", SIZE, 0)
    flat = make_workload("shared_prefix", SIZE, 0)
    assert wl.name == "skewed_prefix" and wl.params["popularity"] == 1.0
    # The same groups and sizes; other text, so one run's routing state cannot leak into the other.
    assert [r.group for r in wl.warmup] == [r.group for r in flat.warmup]
    assert {len(r.messages[0][1].split()) for r in wl.warmup} == {int(flat.params["prefix"])}
    assert wl.warmup[0].messages[0][1][:64] != flat.warmup[0].messages[0][1][:64]
    n = int(wl.params["groups"])
    counts = Counter(r.group for r in itertools.islice(wl.requests(), 20_000))
    harmonic = sum(1 / k for k in range(1, n + 1))
    for k in (1, 2, 10):
        assert counts[f"g{k - 1}"] / 20_000 == pytest.approx(1 / k / harmonic, rel=0.1)
    # Group 0 alone is more than a fifth of the traffic: one replica cannot hold it at load.
    assert counts["g0"] / 20_000 > 0.2
    # The uniform default is unchanged by the parameter's existence (earlier reports replay).
    assert "popularity" not in flat.params
    with pytest.raises(WorkloadError, match="popularity"):
        make_workload("skewed_prefix", SIZE, 0, {"popularity": 0})
    with pytest.raises(WorkloadError, match="popularity"):
        make_workload("shared_prefix", SIZE, 0, {"popularity": -1})


def test_no_two_workloads_start_alike() -> None:
    # A contender keeps its routing state from one workload to the next while the replicas'
    # caches are reset in between: a shared opening would look like a cached prefix.
    for seed in (0, 1):
        openings = {
            name: {r.messages[0][1][:48] for r in make_workload(name, SIZE, seed).warmup}
            for name in WORKLOADS
        }
        for a, b in itertools.combinations(WORKLOADS, 2):
            assert not openings[a] & openings[b], (a, b, seed)
