"""The preemption detector: vLLM's counter parsed, its jump per scrape ejecting a replica."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.config import ReplicaConfig, ScoreLoopConfig
from gateway.replicas.outlier import OutlierConfig, OutlierPolicy
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.score_loop import ScoreLoop
from simulator.metrics import EngineStats, Gauges, render
from tests.gateway.aiohttp_upstream import serve
from vllm_api.metrics import parse_vllm_metrics

LABELS = 'model_name="m",engine="0"'


def test_the_counter_is_parsed_under_both_spellings() -> None:
    stats = EngineStats(preemptions=7)
    text = render(stats, Gauges(0, 0, 0.0), model="m", cache_info={}, max_lora=None).decode()
    assert parse_vllm_metrics(text).preemptions == 7.0  # the simulator's, as vLLM's: _total
    assert parse_vllm_metrics(f"vllm:num_preemptions{{{LABELS}}} 3.0\n").preemptions == 3.0
    assert parse_vllm_metrics("vllm:num_requests_running 1.0\n").preemptions is None


def test_a_jump_over_the_limit_ejects_and_one_at_it_does_not() -> None:
    policy = OutlierPolicy(OutlierConfig(max_preemptions_per_scrape=10), ["r0", "r1"])
    assert policy.preempted("r0", 0.0, 10, others_routable=1) is None
    ejection = policy.preempted("r0", 1.0, 11, others_routable=1)
    assert ejection is not None and ejection.reason == "preemptions"
    assert policy.ejected("r0") and ejection.until == 1.0 + 30.0
    # Under the share cap (1 of 2) the other replica stays in, however hard it thrashes.
    assert policy.preempted("r1", 2.0, 1000, others_routable=0) is None
    assert not policy.ejected("r1")


def test_zero_turns_the_detector_off() -> None:
    policy = OutlierPolicy(OutlierConfig(max_preemptions_per_scrape=0), ["r0", "r1"])
    assert policy.preempted("r0", 0.0, 1e9, others_routable=1) is None


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="max_preemptions_per_scrape"):
        OutlierConfig(max_preemptions_per_scrape=-1)


class Replica:
    """A replica's /metrics with a preemption counter the test sets."""

    def __init__(self) -> None:
        self.preemptions = 0.0
        self.requests_ok = 10.0

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            text=f"vllm:num_preemptions_total{{{LABELS}}} {self.preemptions}\n"
            f'vllm:request_success_total{{{LABELS},finished_reason="stop"}} {self.requests_ok}\n'
        )


@pytest.fixture
async def scraped() -> AsyncIterator[tuple[Replica, ReplicaPool, ScoreLoop]]:
    upstream = Replica()
    app = web.Application()
    app.router.add_get("/metrics", upstream.metrics)
    async with serve(app) as url, aiohttp.ClientSession() as session:
        configs = (
            ReplicaConfig(url=url, name="r0"),
            ReplicaConfig(url="http://r1.test", name="r1"),
        )
        pool = ReplicaPool.from_configs(configs)
        pool.configure_outlier(OutlierConfig(max_preemptions_per_scrape=50))
        for replica in pool:
            pool.probe_passed(replica)
        loop = ScoreLoop(
            ScoreLoopConfig(), session, lambda _n, _b: None, on_preemptions=pool.preempted
        )
        yield upstream, pool, loop


async def test_the_score_loop_ejects_on_a_jump_between_two_scrapes(
    scraped: tuple[Replica, ReplicaPool, ScoreLoop],
) -> None:
    upstream, pool, loop = scraped
    r0 = pool["r0"]
    upstream.preemptions = 5000.0  # a long-lived replica: the first scrape is no jump
    assert await loop.scrape(r0)
    upstream.preemptions += 50  # at the limit
    assert await loop.scrape(r0)
    assert r0.healthy and pool.ejections["r0"] == {}
    upstream.preemptions += 51
    assert await loop.scrape(r0)
    assert not r0.healthy and pool.outlier.ejected("r0")
    assert pool.ejections["r0"] == {"preemptions": 1}


async def test_a_restart_is_no_jump(scraped: tuple[Replica, ReplicaPool, ScoreLoop]) -> None:
    upstream, pool, loop = scraped
    r0 = pool["r0"]
    upstream.preemptions = 40.0
    assert await loop.scrape(r0)
    # A new process (its requests counter went back): its 100 preemptions are no jump of 60
    # over the old process's 40, they may have taken its whole life.
    upstream.preemptions, upstream.requests_ok = 100.0, 1.0
    assert await loop.scrape(r0)
    assert r0.healthy and pool.ejections["r0"] == {}
    upstream.preemptions += 51  # and from there on its own jumps count
    assert await loop.scrape(r0)
    assert pool.ejections["r0"] == {"preemptions": 1}
