"""A replica whose vLLM counters go back restarted: the tiers forget it, its windows restart."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import cast

import aiohttp
import orjson
import pytest

from gateway.config import GatewayConfig, ReplicaConfig, ScoreLoopConfig
from gateway.proxy.affinity import Affinity
from gateway.proxy.requests import parse_request
from gateway.replicas.score_loop import ScoreLoop, restarted
from gateway.replicas.state import ReplicaState
from gateway.runtime import Runtime
from routing.types import RequestFeatures
from vllm_api.kv_events import AllBlocksCleared, EventBatch
from vllm_api.metrics import VllmMetrics

BEFORE = VllmMetrics(
    requests_ok=100.0, requests_failed=2.0, prefix_queries=9000.0, num_gpu_blocks=500
)


class Recorder:
    """The score loop's callbacks, as calls."""

    def __init__(self) -> None:
        self.capacity: list[tuple[str, int]] = []
        self.restarts: list[str] = []

    def loop(self) -> ScoreLoop:
        # The session is only used to scrape; _apply is all these tests drive.
        return ScoreLoop(
            ScoreLoopConfig(),
            cast(aiohttp.ClientSession, None),
            lambda name, blocks: self.capacity.append((name, blocks)),
            on_restart=self.restarts.append,
        )


def _replica(name: str = "r0") -> ReplicaState:
    return ReplicaState(ReplicaConfig(url=f"http://{name}.test:8000", name=name))


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ({"requests_ok": 101.0, "prefix_queries": 9100.0}, False),
        ({}, False),  # nothing new: an idle replica
        ({"prefix_queries": None}, False),  # unknown is not "went back"
        ({"requests_ok": 3.0}, True),
        ({"requests_failed": 0.0}, True),
        ({"prefix_queries": 16.0}, True),
    ],
)
def test_a_counter_going_back_is_a_restart(after: dict[str, object], expected: bool) -> None:
    assert restarted(BEFORE, replace(BEFORE, **after)) is expected  # type: ignore[arg-type]


def test_the_score_loop_reports_a_restart_once_and_restarts_its_windows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = Recorder()
    loop, replica = rec.loop(), _replica()
    loop._apply(replica, BEFORE, now=0.0)
    loop._apply(replica, replace(BEFORE, requests_ok=110.0, requests_failed=3.0), now=1.0)
    assert rec.restarts == [] and rec.capacity == [("r0", 500)]
    assert replica.error_rate == pytest.approx(1 / 11)
    with caplog.at_level(logging.INFO, logger="llm_gateway.score_loop"):
        fresh = VllmMetrics(requests_ok=1.0, prefix_queries=40.0, num_gpu_blocks=500)
        loop._apply(replica, fresh, now=2.0)
    assert rec.restarts == ["r0"]
    # The emptied index is told the cache size again, even though it did not change.
    assert rec.capacity == [("r0", 500), ("r0", 500)]
    [record] = [r for r in caplog.records if "restarted" in r.getMessage()]
    assert record.levelno == logging.INFO and "r0" in record.getMessage()
    # The error-rate window starts at the new process: 1 failure in 4, not a negative delta.
    loop._apply(replica, replace(fresh, requests_ok=4.0, requests_failed=1.0), now=3.0)
    assert replica.error_rate == pytest.approx(1 / 4)
    assert rec.restarts == ["r0"]


def test_no_restart_on_the_first_scrape_or_for_another_replica() -> None:
    rec = Recorder()
    loop, r0, r1 = rec.loop(), _replica("r0"), _replica("r1")
    loop._apply(r0, BEFORE, now=0.0)
    loop._apply(r1, VllmMetrics(requests_ok=1.0), now=0.0)  # first scrape: nothing before
    loop._apply(r1, VllmMetrics(requests_ok=2.0), now=1.0)
    assert rec.restarts == []


def _features(aff: Affinity, prompt: str, session: str) -> RequestFeatures:
    body = orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 1})
    return aff.features(
        parse_request("completions", body, "r"), [(b"x-session-id", session.encode())]
    )


def _tiers(f: RequestFeatures) -> tuple[str | None, str | None, str | None]:
    return f.prompt_cache_replica, f.session_replica, f.prefix_home_replica


def test_a_restart_makes_every_tier_forget_the_replica() -> None:
    cfg = GatewayConfig(
        replicas=(
            ReplicaConfig("http://r0.test:8000", "r0"),
            ReplicaConfig("http://r1.test:8000", "r1"),
        )
    )
    runtime = Runtime(cfg)
    aff = runtime.affinity
    # r0 is precise (KV events), so it also keeps prefix homes; r1 learns from routing.
    aff.prefixes.apply_events("r0", EventBatch(0.0, (AllBlocksCleared(),)), 0)
    system = "a shared system prompt " * 30
    on_r0, on_r1 = _features(aff, system + "one?", "s0"), _features(aff, "other " * 80, "s1")
    aff.record(on_r0, "r0")
    aff.record(on_r1, "r1")
    runtime.pool["r0"].cached_blocks = 7
    again = _features(aff, system + "one?", "s0")
    assert _tiers(again) == ("r0", "r0", "r0")
    assert aff.homes.lookup(on_r0.block_hashes) is not None

    # Wired as the runtime wires it: the score loop sees r0's counters go back.
    loop = ScoreLoop(
        ScoreLoopConfig(),
        cast(aiohttp.ClientSession, None),
        aff.prefixes.set_capacity,
        on_restart=runtime._replica_restarted,
    )
    r0 = runtime.pool["r0"]
    loop._apply(r0, BEFORE, now=0.0)
    loop._apply(r0, VllmMetrics(requests_ok=1.0, num_gpu_blocks=500), now=1.0)

    assert aff.prompts.get(on_r0.prompt_hash, 0.0) is None  # type: ignore[arg-type]
    assert aff.sessions.get("s0", 0.0) is None
    assert aff.homes.lookup(on_r0.block_hashes) is None
    assert "r0" not in aff.prefixes.match(on_r0.block_hashes)
    assert aff.prefixes.blocks("r0") == 0 and r0.cached_blocks == 0
    assert aff.prefixes.mode("r0") == "approximate"  # until its new publisher's events arrive
    after = _features(aff, system + "one?", "s0")
    assert _tiers(after) == (None, None, None) and after.prefix_match == {}
    # The other replica keeps everything.
    other = _features(aff, "other " * 80, "s1")
    assert (other.prompt_cache_replica, other.session_replica) == ("r1", "r1")
    assert other.prefix_match == {"r1": len(on_r1.block_hashes)}
