import asyncio

import pytest

from simulator.config import SimConfig
from simulator.engine import Engine, EngineRequest
from simulator.timing import TimingModel
from tests.simulator.conftest import wait_for

SCALE = 10.0


def test_timing_model_shape_and_scale() -> None:
    t = TimingModel()
    assert t.decode_s(0) == pytest.approx(0.009)
    assert t.decode_s(200) == pytest.approx(0.018)
    assert t.prefill_s(0) == 0.0
    assert t.prefill_s(256) == pytest.approx(0.0762)
    # 256-token cold prompt: inside vllm.md's 60-120 ms TTFT range.
    assert 0.06 <= t.step_s(1, 256) <= 0.12
    assert TimingModel(time_scale=10).step_s(4, 100) == pytest.approx(t.step_s(4, 100) / 10)


def _req(ids: list[int], engine: Engine, max_tokens: int = 4, rid: str = "r") -> EngineRequest:
    return EngineRequest(
        prompt_ids=ids,
        hashes=engine.cache.block_hashes(ids),
        request_id=rid,
        max_tokens=max_tokens,
    )


async def _run(engine: Engine, reqs: list[EngineRequest]) -> None:
    for r in reqs:
        engine.submit(r)
    await asyncio.wait_for(asyncio.gather(*(engine.wait(r, r.max_tokens) for r in reqs)), 10)


async def test_cached_prefix_lowers_ttft_by_the_modelled_amount() -> None:
    engine = Engine(SimConfig(time_scale=SCALE))
    engine.start()
    try:
        ids = list(range(1000, 1320))  # 20 full blocks of 16
        await _run(engine, [_req(ids, engine, rid="cold")])
        warm = _req(ids, engine, rid="warm")
        await _run(engine, [warm])
        assert warm.num_cached_tokens == 304  # 19 blocks: the last token is always recomputed
        cold_t, warm_t = engine.timings[0], engine.timings[1]
        expected = engine.timing.prefill_per_token_ms * 304 / 1000 / SCALE
        assert cold_t.modelled_ttft - warm_t.modelled_ttft == pytest.approx(expected, abs=2e-4)
        assert warm_t.modelled_ttft == pytest.approx(engine.timing.step_s(1, 16), abs=2e-4)
    finally:
        await engine.stop()


async def test_more_running_sequences_make_steps_slower() -> None:
    engine = Engine(SimConfig(time_scale=SCALE))
    engine.start()
    try:
        await _run(engine, [_req([1, 2, 3], engine, max_tokens=20, rid="solo")])
        batch = [_req([7, i, 9], engine, max_tokens=20, rid=f"b{i}") for i in range(64)]
        await _run(engine, batch)
        solo = engine.timings[0].modelled_itl
        many = [t.modelled_itl for t in list(engine.timings)[1:]]
        assert solo == pytest.approx(engine.timing.decode_s(1), rel=1e-6)
        assert min(many) == pytest.approx(engine.timing.decode_s(64), rel=1e-6)
        assert min(many) > solo
    finally:
        await engine.stop()


async def test_full_cache_makes_requests_wait() -> None:
    # 8 blocks of 16 tokens: one 100-token request (+20 output) at a time fits.
    engine = Engine(SimConfig(time_scale=2.0, num_gpu_blocks=8, block_size=16))
    engine.start()
    try:
        a = _req(list(range(100)), engine, max_tokens=20, rid="a")
        b = _req(list(range(500, 600)), engine, max_tokens=10, rid="b")
        engine.submit(a)
        engine.submit(b)
        await wait_for(lambda: a.num_generated >= 1)
        assert engine.num_running == 1 and engine.num_waiting == 1
        await asyncio.wait_for(engine.wait(b, 10), 10)
        ta, tb = engine.timings[0], engine.timings[1]
        assert b.t_first > a.t_last
        assert tb.modelled_ttft > ta.modelled_ttft + 19 * ta.modelled_itl
    finally:
        await engine.stop()


async def test_finish_abort_frees_the_slot_at_once() -> None:
    engine = Engine(SimConfig(time_scale=SCALE))
    engine.start()
    try:
        r = _req(list(range(40)), engine, max_tokens=10_000)
        engine.submit(r)
        await wait_for(lambda: r.num_generated >= 2)
        engine.finish(r, "abort")
        assert engine.num_running == 0 and engine.cache.num_used == 0
        assert engine.stats.success["abort"] == 1
    finally:
        await engine.stop()
