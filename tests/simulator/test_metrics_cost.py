"""A /metrics render costs the simulated API server time its engine would have streamed in."""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
import pytest

from simulator import SimConfig, SimFleet
from simulator.cli import add_arguments, config_from_args
from simulator.config import SimError
from simulator.engine import MAX_LAG_S, Engine
from simulator.timing import METRICS_COST_MS, TimingModel

# A render of 100 ms at 20x: 5 ms per scrape against a 0.45 ms decode step.
CFG = SimConfig(time_scale=20.0, seed=3, kv_events=False, metrics_cost_ms=100.0)
TOKENS = 600


async def _stream(s: aiohttp.ClientSession, url: str) -> float:
    """Seconds from sending a streamed completion of TOKENS tokens to its last byte."""
    body = {"model": CFG.model, "prompt": "count", "max_tokens": TOKENS, "ignore_eos": True,
            "stream": True}  # fmt: skip
    started = time.monotonic()
    async with s.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
    return time.monotonic() - started


def _modelled_itl_is_the_decode_step(engine: Engine, cfg: SimConfig) -> bool:
    """True when the engine's one request's modelled ITL is one decode step, give or take
    the clock restarts a stalled loop (a loaded CI machine) spread over its tokens."""
    (t,) = engine.timings
    step = cfg.timing.decode_s(1)
    lag = engine.lagged_s / (t.tokens - 1)
    return step * (1 - 1e-6) <= t.modelled_itl <= (step + lag) * (1 + 1e-6)


async def _scrape_until(s: aiohttp.ClientSession, url: str, done: asyncio.Event) -> int:
    n = 0
    while not done.is_set():
        async with s.get(url + "/metrics") as resp:
            assert resp.status == 200
            await resp.read()
        n += 1
    return n


async def test_a_replica_scraped_in_a_tight_loop_streams_slower() -> None:
    async with SimFleet(CFG, replicas=2) as fleet, aiohttp.ClientSession() as s:
        quiet_url, scraped_url = fleet.urls
        # Side by side on one event loop: whatever slows the loop slows both streams.
        done = asyncio.Event()
        scraper = asyncio.create_task(_scrape_until(s, scraped_url, done))
        try:
            quiet, scraped = await asyncio.gather(_stream(s, quiet_url), _stream(s, scraped_url))
        finally:
            done.set()
            scrapes = await scraper
        quiet_engine, scraped_engine = (r.engine for r in fleet.replicas)
        assert scrapes > 10
        # Each render while the engine ran pushed a step back by exactly its cost.
        assert quiet_engine.held_s == 0.0
        assert scraped_engine.held_s >= 10 * CFG.timing.metrics_s()
        (q,), (m,) = quiet_engine.timings, scraped_engine.timings
        assert _modelled_itl_is_the_decode_step(quiet_engine, CFG)
        assert m.modelled_itl > 1.5 * q.modelled_itl
        # And the client sees it: a gap far beyond scheduling noise (about 4x here).
        assert scraped > 1.5 * quiet, (scraped, quiet, scrapes)


async def test_an_idle_engine_owes_nothing_and_renders_queue() -> None:
    async with SimFleet(CFG, replicas=1) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]

        async def one() -> None:
            async with s.get(url + "/metrics") as resp:
                await resp.read()

        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(8)))
        # One render at a time: 8 of 5 ms each take about 40 ms at least, whatever the machine.
        assert time.monotonic() - started >= 7 * CFG.timing.metrics_s()
        assert fleet.replicas[0].engine.held_s == 0.0


async def test_without_a_cost_scrapes_hold_nothing() -> None:
    cfg = SimConfig(time_scale=20.0, seed=3, kv_events=False, metrics_cost_ms=0.0)
    async with SimFleet(cfg, replicas=1) as fleet, aiohttp.ClientSession() as s:
        done = asyncio.Event()
        scraper = asyncio.create_task(_scrape_until(s, fleet.urls[0], done))
        try:
            await _stream(s, fleet.urls[0])
        finally:
            done.set()
            await scraper
        assert fleet.replicas[0].engine.held_s == 0.0
        assert _modelled_itl_is_the_decode_step(fleet.replicas[0].engine, cfg)


def _block_the_loop(seconds: float) -> None:
    """What a starved machine does to the event loop (the simulator shares it here)."""
    time.sleep(seconds)


async def test_a_stalled_loop_restarts_the_clock_and_says_by_how_much() -> None:
    cfg = SimConfig(time_scale=20.0, seed=3, kv_events=False, metrics_cost_ms=0.0)
    body = {"model": cfg.model, "prompt": "count", "max_tokens": TOKENS, "ignore_eos": True,
            "stream": True}  # fmt: skip
    async with SimFleet(cfg, replicas=1) as fleet, aiohttp.ClientSession() as s:
        async with s.post(fleet.urls[0] + "/v1/completions", json=body) as resp:
            await resp.content.readline()  # the first token is out: the engine is stepping
            _block_the_loop(0.5)
            await resp.read()
        engine = fleet.replicas[0].engine
        # At least the stall past MAX_LAG_S was skipped, and it is in the modelled ITL.
        assert engine.lagged_s >= 0.5 - MAX_LAG_S - 0.05
        (t,) = engine.timings
        assert t.modelled_itl > cfg.timing.decode_s(1) * 1.1
        assert _modelled_itl_is_the_decode_step(engine, cfg)


def test_the_cost_is_a_knob_scaled_like_every_timing() -> None:
    assert SimConfig().metrics_cost_ms == METRICS_COST_MS
    assert TimingModel(metrics_cost_ms=8.0, time_scale=4.0).metrics_s() == pytest.approx(0.002)
    with pytest.raises(SimError, match="metrics_cost_ms"):
        SimConfig(metrics_cost_ms=-1.0)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.get_default("metrics_cost_ms") == METRICS_COST_MS
    assert config_from_args(parser.parse_args(["--metrics-cost-ms", "3"])).metrics_cost_ms == 3.0
