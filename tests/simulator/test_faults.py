import asyncio
import time

import aiohttp
import orjson
import pytest

from simulator import Faults, SimConfig, SimFleet
from tests.simulator.conftest import wait_for

CFG = SimConfig(time_scale=20.0, seed=3)
STREAM = {"prompt": "tell me a story", "max_tokens": 30, "stream": True}


async def _set(s: aiohttp.ClientSession, url: str, **patch: object) -> dict[str, object]:
    async with s.post(f"{url}/_sim/faults", json=patch) as resp:
        assert resp.status == 200
        return dict(await resp.json())


async def _status(s: aiohttp.ClientSession, url: str, path: str = "/health") -> int:
    async with s.get(url + path) as resp:
        return resp.status


async def test_admin_endpoint_partial_update_and_unknown_field() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        new = await _set(s, url, error_rate=0.5)
        assert new == {**Faults().to_json(), "error_rate": 0.5}
        async with s.post(f"{url}/_sim/faults", json={"bogus": 1}) as resp:
            assert resp.status == 400
        async with s.get(f"{url}/_sim/faults") as resp:
            assert (await resp.json())["error_rate"] == 0.5


async def test_error_rate_uses_a_seeded_rng() -> None:
    async def run() -> list[int]:
        async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
            url = fleet.urls[0]
            await _set(s, url, error_rate=0.5, error_status=503)
            out = []
            for _ in range(20):
                body = {"prompt": "x", "max_tokens": 1}
                async with s.post(f"{url}/v1/completions", json=body) as resp:
                    out.append(resp.status)
                    if resp.status == 503:
                        assert (await resp.json())["error"]["code"] == 503
            return out

    first = await run()
    assert set(first) == {200, 503}
    assert first == await run()


async def test_reset_before_first_byte() -> None:
    cfg = SimConfig(time_scale=20.0, faults=Faults(reset_before_first_byte=True))
    async with SimFleet(cfg) as fleet, aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.post(f"{fleet.urls[0]}/v1/completions", json=STREAM) as resp:
                await resp.read()
        assert fleet.replicas[0].engine.num_waiting == 0


async def test_reset_after_n_tokens_cuts_the_stream() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        await _set(s, fleet.urls[0], reset_after_tokens=3)
        got = []
        with pytest.raises(aiohttp.ClientError):
            async with s.post(f"{fleet.urls[0]}/v1/completions", json=STREAM) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        got.append(orjson.loads(line[6:])["choices"][0]["text"])
        assert len(got) == 3
        await wait_for(lambda: fleet.replicas[0].engine.num_running == 0, 1.0)


@pytest.mark.parametrize("after", [None, 2])
async def test_stall_sends_no_bytes_for_the_stall_time(after: int | None) -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        await _set(s, fleet.urls[0], stall_seconds=0.4, stall_after_tokens=after)
        stamps = []
        words = 0
        t0 = time.monotonic()
        async with s.post(f"{fleet.urls[0]}/v1/completions", json=STREAM) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    stamps.append(time.monotonic())
                    words += len(orjson.loads(line[6:])["choices"][0]["text"].split())
        gaps = [b - a for a, b in zip([t0, *stamps], stamps, strict=False)]
        assert words == 30  # tokens generated during the stall arrive together afterwards
        assert max(gaps) >= 0.4
        assert gaps.index(max(gaps)) == (0 if after is None else after)


async def test_unhealthy_and_slow_start() -> None:
    cfg = SimConfig(faults=Faults(slow_start_seconds=0.3))
    async with SimFleet(cfg) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        assert await _status(s, url) == 503
        deadline = time.monotonic() + 3
        while await _status(s, url) != 200:
            assert time.monotonic() < deadline
        await _set(s, url, unhealthy=True)
        assert await _status(s, url) == 503
        await _set(s, url, unhealthy=False)
        assert await _status(s, url) == 200


async def test_engine_death_fails_inflight_and_new_requests() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        body = {**STREAM, "max_tokens": 5000}
        async with s.post(f"{url}/v1/completions", json=body) as resp:
            await resp.content.readline()
            await _set(s, url, dead=True)
            frames = (await resp.read()).split(b"\n\n")
        tail = [f for f in frames if f]
        assert b"[DONE]" not in tail[-1]
        assert orjson.loads(tail[-1][6:])["error"]["code"] == 500
        assert await _status(s, url) == 503
        async with s.post(
            f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        ) as resp:
            assert resp.status == 500
            assert (await resp.json())["error"]["type"] == "InternalServerError"


async def test_out_of_kv_fault() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        await _set(s, fleet.urls[0], out_of_kv=True)
        async with s.post(f"{fleet.urls[0]}/v1/completions", json=STREAM) as resp:
            assert resp.status == 500
            assert "KV cache" in (await resp.json())["error"]["message"]


async def test_restart_cuts_streams_and_clears_cache() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        rep = fleet.replicas[0]
        body = {"prompt": "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 4}
        async with s.post(f"{rep.url}/v1/completions", json={**body, "max_tokens": 1}) as resp:
            assert resp.status == 200
        assert rep.engine.cache.num_cached > 0
        with pytest.raises(aiohttp.ClientError):
            async with s.post(
                f"{rep.url}/v1/completions", json={**body, "max_tokens": 5000, "stream": True}
            ) as resp:
                await resp.content.readline()
                async with s.post(f"{rep.url}/_sim/restart") as r2:
                    assert r2.status == 200
                await asyncio.wait_for(resp.read(), 5)
        assert rep.engine.num_running == 0 and rep.engine.cache.num_cached == 0
        async with s.post(f"{rep.url}/v1/completions", json={**body, "max_tokens": 1}) as resp:
            usage = (await resp.json())["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # nothing cached any more
