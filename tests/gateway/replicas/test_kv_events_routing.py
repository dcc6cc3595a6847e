"""Precise mode: the simulator's KV events over ZMQ fill the gateway's prefix index."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

import httpx

from cache_index.hashing import block_hashes
from gateway.config import CacheIndexConfig
from gateway.process import running_gateway
from simulator import SimFleet
from tests.gateway.conftest import MODEL, SIM, eventually, gateway_config
from vllm_api.tokenizer import BuiltinTokenizer

PROMPT = "The quarterly report covers revenue, costs and outlook. " * 40


async def test_kv_events_fill_and_clear_the_precise_index() -> None:
    sim = replace(SIM, kv_events=True)
    async with SimFleet(sim, replicas=2, host="127.0.0.1", base_port=0) as fleet:
        cfg = gateway_config(fleet, cache_index=CacheIndexConfig(tokenizer="builtin"))
        cfg = replace(cfg, replicas=tuple(replace(r, kv_events="auto") for r in cfg.replicas))
        async with running_gateway(cfg) as gw, httpx.AsyncClient(base_url=gw.url) as c:
            index = gw.runtime.affinity.prefixes
            subscriber = gw.runtime.kv_events
            # ZMQ subscriptions join asynchronously, so an event sent before a SUB socket is
            # live is lost. A cache reset (AllBlocksCleared, published with the next engine
            # step, as vLLM does) that arrives proves the subscription live and puts the
            # replica in precise mode: reset and step until it does.
            tiny = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
            deadline = time.monotonic() + 20
            async with httpx.AsyncClient() as admin:
                for r in fleet.replicas:
                    while r.name not in index.replicas() or index.mode(r.name) != "precise":
                        assert time.monotonic() < deadline, f"{r.name} never became precise"
                        await admin.post(r.url + "/reset_prefix_cache")
                        await admin.post(r.url + "/v1/completions", json=tiny)
                        with contextlib.suppress(AssertionError):
                            await eventually(
                                lambda r=r: (
                                    r.name in index.replicas() and index.mode(r.name) == "precise"
                                ),
                                timeout=0.5,
                            )
            seen = dict(subscriber.batches)
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200
            hashes = block_hashes(BuiltinTokenizer().encode(PROMPT), SIM.block_size)
            served = next(rep for rep in gw.runtime.pool if rep.requests_total == 1)
            await eventually(lambda: subscriber.batches != seen, what="BlockStored received")
            await eventually(
                lambda: index.match(hashes).get(served.name, 0) == len(hashes),
                what="every full prompt block indexed on the serving replica",
            )
            assert index.mode(served.name) == "precise"
            # The same prompt goes back to the replica holding it.
            r = await c.post("/v1/completions", json=body)
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            # A restart clears the replica's cache: its old prefixes stop attracting traffic.
            sim_replica = next(x for x in fleet.replicas if x.name == served.name)
            async with httpx.AsyncClient() as admin:
                await admin.post(sim_replica.url + "/_sim/restart")
            await eventually(
                lambda: served.name not in index.match(hashes), what="blocks gone after restart"
            )
            # Its cache is empty now, but the prefix goes back to the replica that had it
            # (recomputed there) instead of being placed anew: a new question on the same
            # prefix, so tier 1 (whole-prompt hash) cannot be what sends it.
            before = served.requests_total
            other = {**body, "prompt": PROMPT + "And one more question?"}
            r = await c.post("/v1/completions", json=other)
            assert r.status_code == 200
            assert served.requests_total == before + 1
            assert 'branch="prefix_home"' in (await c.get("/metrics")).text
