"""The adaptive scrape cadence end to end: a gateway in front of the simulated fleet."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import ScoreLoopConfig
from simulator import SimFleet
from tests.gateway.conftest import MODEL, eventually, gateway_config, in_process

# The default bounds divided by 12.5: the same back-off, in a fraction of a second.
FAST = ScoreLoopConfig(
    scrape_interval_s=0.02,
    steady_scrape_interval_s=0.16,
    idle_scrape_interval_s=0.4,
    max_scrapes_per_s=100.0,
)
LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "keep it busy"}],
    "max_tokens": 2000,
    "ignore_eos": True,
}


async def test_idle_replicas_back_off_and_a_burst_brings_scrapes_back(fleet: SimFleet) -> None:
    async with in_process(gateway_config(fleet, score_loop=FAST)) as gw:
        pool = gw.runtime.pool
        await eventually(
            lambda: all(r.scrape_interval_s == pytest.approx(0.4) for r in pool),
            what="idle back-off",
        )
        assert all(s.freshness == 1.0 for s in pool.snapshots())
        before = {r.name: r.scrapes_total for r in pool}

        burst = [asyncio.create_task(gw.client.post("/v1/chat/completions", json=LONG))]
        burst += [
            asyncio.create_task(gw.client.post("/v1/chat/completions", json=LONG)) for _ in range(5)
        ]

        def followed() -> bool:
            loaded = [r for r in pool if r.in_flight >= 2]
            return bool(loaded) and all(
                r.scrape_interval_s <= 0.16
                and r.metrics is not None
                and (r.metrics.running or 0.0) >= 2
                for r in loaded
            )

        await eventually(followed, what="loaded replicas scraped at the steady cadence or faster")
        assert all(r.status_code == 200 for r in await asyncio.gather(*burst))
        await eventually(
            lambda: all(r.scrape_interval_s == pytest.approx(0.4) for r in pool), what="idle again"
        )
        assert all(r.scrapes_total > before[r.name] for r in pool if r.requests_total)

        text = (await gw.client.get("/metrics")).text
        for r in pool:
            assert f'llm_gateway_replica_scrapes_total{{replica="{r.name}"}}' in text
            assert f'llm_gateway_replica_scrape_interval_seconds{{replica="{r.name}"}}' in text
