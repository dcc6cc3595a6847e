import asyncio
import itertools

import aiohttp
import orjson
import zmq
import zmq.asyncio

from simulator import SimConfig, SimFleet
from tests.simulator.conftest import wait_for
from vllm_api.kv_events import AllBlocksCleared, BlockStored, decode_batch, decode_seq

CFG = SimConfig(time_scale=20.0, lora_adapters=("lora-a",), seed=7)
PROMPT = "The quick brown fox jumps over the lazy dog near the river bank. " * 20


async def _sse(resp: aiohttp.ClientResponse) -> list[bytes]:
    body = await resp.read()
    return [f for f in body.split(b"\n\n") if f]


async def test_completions_cached_tokens_and_metrics_agree() -> None:
    async with SimFleet(CFG, replicas=2) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        usages = []
        for _ in range(2):
            body = {"model": CFG.model, "prompt": PROMPT, "max_tokens": 5}
            async with s.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                data = await resp.json()
                usages.append(data["usage"])
                assert data["choices"][0]["finish_reason"] == "length"
        assert usages[0]["prompt_tokens_details"]["cached_tokens"] == 0  # vLLM: 0, not null
        cached = usages[1]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and cached % CFG.block_size == 0
        async with s.get(f"{url}/metrics") as resp:
            text = await resp.text()
        assert (
            f'vllm:prefix_cache_hits_total{{model_name="{CFG.model}",engine="0"}} {cached}.0'
            in text
        )
        assert 'vllm:lora_requests_info{max_lora="4"' in text
        assert 'num_gpu_blocks="4096"' in text


async def test_chat_stream_with_usage_and_lora_model() -> None:
    async with SimFleet(CFG, replicas=1) as fleet, aiohttp.ClientSession() as s:
        body = {
            "model": "lora-a",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with s.post(f"{fleet.urls[0]}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            frames = await _sse(resp)
        assert frames[-1] == b"data: [DONE]"
        chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
        async with s.get(f"{fleet.urls[0]}/v1/models") as resp:
            models = (await resp.json())["data"]
        assert [(m["id"], m["parent"]) for m in models] == [
            (CFG.model, None),
            ("lora-a", CFG.model),
        ]


async def test_n_choices_unary_and_streamed() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        body = {"prompt": PROMPT, "max_tokens": 4, "n": 3, "ignore_eos": True}
        async with s.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            out = await resp.json()
        assert [c["index"] for c in out["choices"]] == [0, 1, 2]
        assert len({c["text"] for c in out["choices"]}) == 3  # each choice its own text
        assert out["usage"]["completion_tokens"] == 12
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with s.post(f"{url}/v1/completions", json=body) as resp:
            frames = await _sse(resp)
        assert frames[-1] == b"data: [DONE]"
        chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
        finals = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks[:-1]
                  if c["choices"][0]["finish_reason"] is not None}  # fmt: skip
        assert finals == {0: "length", 1: "length", 2: "length"}
        texts = {i: "".join(c["choices"][0]["text"] for c in chunks[:-1]
                            if c["choices"][0]["index"] == i) for i in range(3)}  # fmt: skip
        assert texts == {c["index"]: c["text"] for c in out["choices"]}
        assert chunks[-1]["usage"]["completion_tokens"] == 12


async def test_tokenize_strs_and_lora_info_outlive_the_request() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        body = {"prompt": "hello there world", "return_token_strs": True}
        async with s.post(f"{url}/tokenize", json=body) as resp:
            out = await resp.json()
        assert len(out["token_strs"]) == out["count"] > 0
        body = {"model": "lora-a", "prompt": "hi", "max_tokens": 2}
        async with s.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
        # Finished now, yet vLLM keeps the series of every label set it ever set.
        async with s.get(f"{url}/metrics") as resp:
            text = await resp.text()
        assert 'running_lora_adapters="lora-a",waiting_lora_adapters=""}' in text


async def test_stream_interval_groups_tokens_per_chunk() -> None:
    cfg = SimConfig(time_scale=20.0, stream_interval=4)
    async with SimFleet(cfg) as fleet, aiohttp.ClientSession() as s:
        body = {"prompt": "hi", "max_tokens": 9, "stream": True}
        async with s.post(f"{fleet.urls[0]}/v1/completions", json=body) as resp:
            frames = await _sse(resp)
        texts = [orjson.loads(f[6:])["choices"][0]["text"] for f in frames[:-1]]
        assert [len(t.split()) for t in texts] == [1, 4, 4]


async def test_client_disconnect_frees_the_slot() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        rep = fleet.replicas[0]
        body = {"prompt": PROMPT, "max_tokens": 5000, "stream": True}
        resp = await s.post(f"{rep.url}/v1/completions", json=body)
        await resp.content.readline()
        assert rep.engine.num_running == 1
        resp.close()
        await wait_for(lambda: rep.engine.num_running == 0, within=1.0)
        assert rep.engine.cache.num_used == 0
        # Non-streamed request abandoned while waiting: same result.
        task = asyncio.create_task(
            s.post(f"{rep.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 5000})
        )
        await wait_for(lambda: rep.engine.num_running == 1)
        task.cancel()
        await wait_for(lambda: rep.engine.num_running == 0, within=1.0)


async def test_errors_have_vllm_bodies() -> None:
    cfg = SimConfig(max_model_len=64)
    async with SimFleet(cfg) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        cases = [
            (b"{nope", 400, "Bad Request", None),
            (b'{"max_tokens": 2}', 400, "BadRequestError", "prompt"),
            (b'{"model":"x","prompt":"a"}', 404, "NotFoundError", "model"),
            (orjson.dumps({"prompt": "word " * 100}), 400, "BadRequestError", "input_tokens"),
            (orjson.dumps({"prompt": "a", "max_tokens": 65}), 400, "BadRequestError",
             "max_tokens"),
        ]  # fmt: skip
        for raw, status, kind, param in cases:
            async with s.post(f"{url}/v1/completions", data=raw) as resp:
                assert resp.status == status
                err = (await resp.json())["error"]
                assert (err["type"], err["param"], err["code"]) == (kind, param, status)
                if param in ("input_tokens", "max_tokens"):
                    assert f"(parameter={param}, value=" in err["message"]
        # prompt + max_tokens over the context is clamped, not refused (vLLM 0.32).
        body = {"prompt": "a b c", "max_tokens": 64, "ignore_eos": True}
        async with s.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            usage = (await resp.json())["usage"]
            assert usage["total_tokens"] == 64 and usage["completion_tokens"] < 64
        for method, path, status, detail in (
            ("GET", "/v1/nope", 404, "Not Found"),
            ("GET", "/v1/completions", 405, "Method Not Allowed"),
        ):
            async with s.request(method, f"{url}{path}") as resp:
                assert resp.status == status
                assert resp.content_type == "application/json"
                assert await resp.json() == {"detail": detail}


async def test_kv_events_stored_cleared_and_replayed() -> None:
    cfg = SimConfig(time_scale=20.0, block_size=16)
    async with SimFleet(cfg) as fleet, aiohttp.ClientSession() as s:
        rep = fleet.replicas[0]
        assert rep.kv_events_endpoint and rep.replay_endpoint
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(rep.kv_events_endpoint)
        try:
            # PUB/SUB joins asynchronously: send fresh prompts until the subscriber sees a batch.
            async def first_frames() -> list[bytes]:
                for i in itertools.count():
                    body = {"prompt": f"{i} {PROMPT}", "max_tokens": 1}
                    async with s.post(f"{rep.url}/v1/completions", json=body) as resp:
                        assert resp.status == 200
                    if await sub.poll(50):
                        return list(await sub.recv_multipart())
                raise AssertionError("unreachable")

            frames = await asyncio.wait_for(first_frames(), 5)
            assert frames[0] == b"kv" and len(frames) == 3
            while await sub.poll(100):  # the rest of the warm-up requests' batches
                await sub.recv_multipart()
            # The reset's AllBlocksCleared waits for the next engine step, as in vLLM.
            async with s.post(f"{rep.url}/reset_prefix_cache") as resp:
                assert await resp.json() == {"success": True}
            assert not await sub.poll(200)
            body = {"prompt": PROMPT, "max_tokens": 1}
            async with s.post(f"{rep.url}/v1/completions", json=body) as resp:
                assert resp.status == 200
            frames = await asyncio.wait_for(sub.recv_multipart(), 5)
            first, *rest = decode_batch(frames[2]).events
            assert first == AllBlocksCleared()
            stored = next(e for e in rest if isinstance(e, BlockStored))
            assert stored.parent_block_hash is None and stored.block_size == 16
            assert len(stored.token_ids) == 16 * len(stored.block_hashes)
            seq = decode_seq(frames[1])
            async with s.post(f"{rep.url}/_sim/restart") as resp:
                assert resp.status == 200
            frames = await asyncio.wait_for(sub.recv_multipart(), 5)
            assert decode_seq(frames[1]) == 0 and seq > 0
            assert decode_batch(frames[2]).events == (AllBlocksCleared(),)
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(rep.replay_endpoint)
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            got = []
            while True:
                _, topic, seq_b, payload = await asyncio.wait_for(dealer.recv_multipart(), 5)
                if decode_seq(seq_b) == -1:
                    assert (topic, payload) == (b"", b"")
                    break
                assert topic == b"kv"
                got.append(decode_batch(payload).events)
            assert got == [(AllBlocksCleared(),)]
            dealer.close(0)
        finally:
            sub.close(0)
            ctx.term()


async def test_reset_prefix_cache_refused_while_a_request_holds_blocks() -> None:
    async with SimFleet(CFG) as fleet, aiohttp.ClientSession() as s:
        rep = fleet.replicas[0]
        body = {"prompt": PROMPT, "max_tokens": 5000, "stream": True}
        async with s.post(f"{rep.url}/v1/completions", json=body) as resp:
            await resp.content.readline()
            async with s.post(f"{rep.url}/reset_prefix_cache") as r2:
                assert r2.status == 200 and await r2.json() == {"success": False}
        await wait_for(lambda: rep.engine.num_running == 0, within=1.0)
        async with s.post(f"{rep.url}/reset_prefix_cache") as r2:
            assert await r2.json() == {"success": True}
