"""What the gateway learns from real replicas: /metrics, KV events, and aborts on disconnect."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from benchmarks.vllm_cpu import VllmFleet, VllmReplica
from cache_index.hashing import block_hashes
from gateway.process import RunningGateway
from tests.vllm.conftest import TIMEOUT_S, gateway_for, metric, reset_caches, wait_until
from vllm_api.metrics import VllmMetrics

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]

RUNNING = "vllm:num_requests_running"
SUCCESS = "vllm:request_success_total"


def _long_stream(fleet: VllmFleet, prompt: str) -> dict[str, Any]:
    # About 3 ms a token here: the engine runs it for about 6 s unless it is aborted.
    return {"model": fleet.model, "prompt": prompt, "max_tokens": fleet.max_model_len - 64,
            "ignore_eos": True, "stream": True}  # fmt: skip


@asynccontextmanager
async def _streaming(client: httpx.AsyncClient, body: dict[str, Any]) -> AsyncIterator[list[bytes]]:
    """A stream sent through the gateway and held unread; dropped (client gone) on exit.

    Yields the first chunks as they come. Nothing waits for them: under CPU contention vLLM's
    SSE writer trails its engine by seconds (measured: the first chunks of a 960-token answer
    came 2.8 s late, after its last token was generated), so a chunk in hand says nothing of
    whether the request still runs. Callers watch the replicas' own gauges instead."""
    first: list[bytes] = []

    async def hold() -> None:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for chunk in resp.aiter_raw():
                first.append(chunk)
                if len(first) == 3:
                    await asyncio.Event().wait()  # unread from here on, until dropped

    async with _in_background(hold()):
        yield first


@asynccontextmanager
async def _in_background(work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Runs `work` until exit, then cancels it; what it failed with before is raised."""
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        if isinstance(outcome, Exception):
            raise outcome


async def _replica_view(fleet: VllmFleet, first: list[bytes] | None = None) -> str:
    """What each replica reports now, its log's last lines, and a stream's first chunks."""
    parts = [] if first is None else [f"first chunks: {first!r:.600}"]
    async with httpx.AsyncClient(timeout=10.0) as direct:
        for r in fleet.replicas:
            try:
                text = (await direct.get(r.url + "/metrics")).text
                gauges = [line for line in text.splitlines() if line.startswith(_SHOWN)]
            except httpx.HTTPError as exc:
                gauges = [f"/metrics failed: {exc!r}"]
            tail = r.log_path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"{r.name}: " + "; ".join(gauges) + "\n  log: " + "\n  log: ".join(tail))
    return "\n".join(parts)


_SHOWN = (RUNNING, "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
          "vllm:generation_tokens_total", "vllm:request_success_total")  # fmt: skip


async def _fleet_sum(
    direct: httpx.AsyncClient, fleet: VllmFleet, name: str, **labels: str
) -> float:
    return sum([await metric(direct, r.url, name, **labels) for r in fleet.replicas])


@asynccontextmanager
async def _keep_busy(client: httpx.AsyncClient, fleet: VllmFleet) -> AsyncIterator[None]:
    """Long answers through the gateway, one after another, until exit.

    One answer keeps the engine busy for about 6 s, but on 2 shared cores a process can go
    unscheduled for as long while vLLM's engine and worker run (measured: 6.4 s): a scrape
    taken after such a stall must still find a request running."""

    async def loop() -> None:
        for i in itertools.count():
            body = {**_long_stream(fleet, f"keep busy {i}"), "stream": False}
            resp = await client.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text

    async with _in_background(loop()):
        yield


async def test_score_loop_reads_real_metrics(fleet: VllmFleet) -> None:
    async with gateway_for(fleet) as (gw, client):
        pool = gw.runtime.pool
        for r in fleet.replicas:
            m = pool[r.name].metrics
            assert m is not None, f"{r.name} never scraped"
            assert m.block_size == fleet.block_size
            assert m.num_gpu_blocks == fleet.num_gpu_blocks
        caps = {s.name: s.cache_capacity_tokens for s in pool.snapshots()}
        assert caps == {r.name: fleet.num_gpu_blocks * fleet.block_size for r in fleet.replicas}
        stats = gw.runtime.affinity.prefixes.stats()
        assert {stats[r.name].capacity for r in fleet.replicas} == {fleet.num_gpu_blocks}

        async with _keep_busy(client, fleet):

            async def busy() -> list[VllmMetrics]:
                ms = [pool[r.name].metrics for r in fleet.replicas]
                return [m for m in ms if m and (m.running or 0) >= 1 and (m.kv_usage or 0) > 0]

            try:
                seen = await wait_until(
                    busy, "a scraped running request with KV usage", within=60.0
                )
            except AssertionError as e:
                errors = {r.name: pool[r.name].scrape_errors for r in fleet.replicas}
                raise AssertionError(
                    f"{e}; scrape errors {errors}\n{await _replica_view(fleet)}"
                ) from e
            # One request at a time: nothing waits.
            assert [m.waiting for m in seen] == [0] * len(seen)

        async def idle() -> bool:
            return all((pool[r.name].metrics or _never()).running == 0 for r in fleet.replicas)

        await wait_until(idle, "running back to 0 in the scraped metrics", within=30.0)


def _never() -> Any:
    raise AssertionError("metrics disappeared")


async def test_client_disconnect_aborts_on_the_replica(fleet: VllmFleet) -> None:
    # A stalled process (see _keep_busy) can miss the request running, or delay the drop
    # or the scrape after it: such an attempt proves nothing either way and is run again.
    # An abort that never reaches vLLM fails every attempt.
    async with gateway_for(fleet) as (_, client), httpx.AsyncClient(timeout=10.0) as direct:
        outcomes: list[float | str] = []
        for attempt in range(3):
            outcome = await _drop_one_stream(
                client, direct, fleet, f"disconnect me early {attempt}"
            )
            if isinstance(outcome, float) and outcome < 1.0:
                return
            outcomes.append(outcome)
    raise AssertionError(f"no stream stopped within 1 s of its drop: {outcomes}")


async def _drop_one_stream(
    client: httpx.AsyncClient, direct: httpx.AsyncClient, fleet: VllmFleet, prompt: str
) -> float | str:
    """Stream through the gateway and drop it while vLLM runs it.

    Returns the seconds from the drop to a scrape showing it stopped, or why it proved nothing."""
    finished = await _fleet_sum(direct, fleet, SUCCESS)
    body = _long_stream(fleet, prompt)
    async with _streaming(client, body) as first:

        async def seen() -> str | None:
            if await _fleet_sum(direct, fleet, RUNNING) >= 1:
                return "running"
            return "finished" if await _fleet_sum(direct, fleet, SUCCESS) > finished else None

        state = await wait_until(seen, "the stream running or finished", within=30.0, interval=0.02)
        if state == "finished":
            return "finished before this process saw it running"
    dropped = time.monotonic()
    seen_at: list[float] = []

    async def stopped() -> bool:
        sent = time.monotonic()
        if await _fleet_sum(direct, fleet, RUNNING) == 0:
            seen_at.append(sent)
            return True
        return False

    try:
        await wait_until(stopped, "vllm:num_requests_running == 0", within=30.0)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{await _replica_view(fleet, first)}") from e
    # vLLM counts no abort in request_success_total: only a request run to its end shows there.
    if await _fleet_sum(direct, fleet, SUCCESS) > finished:
        return f"ran to its end, {seen_at[0] - dropped:.2f} s after the drop"
    # Timed at the scrape that saw it stopped being sent: on 2 shared cores the CPU engine
    # can take seconds to answer /metrics while it finishes a step (measured 3.6 s once).
    return seen_at[0] - dropped


async def _sync_index(gw: RunningGateway, fleet: VllmFleet, client: httpx.AsyncClient) -> None:
    """Empty every cache and wait until the gateway's index is precise for every replica.

    vLLM publishes AllBlocksCleared with the next engine step, so a small request follows each
    reset; repeated until the subscriber (ZMQ slow joiner) has seen it."""
    index = gw.runtime.affinity.prefixes

    async def synced() -> bool:
        await reset_caches(fleet, client)
        for r in fleet.replicas:
            await _complete(client, r, fleet, f"sync {time.monotonic_ns()} " + "papa " * 40)
        await asyncio.sleep(0.2)
        return all(index.mode(r.name) == "precise" for r in fleet.replicas)

    await wait_until(synced, "a precise prefix index for every replica", within=20.0)


async def _complete(
    client: httpx.AsyncClient, replica: VllmReplica, fleet: VllmFleet, prompt: str
) -> None:
    body = {"model": fleet.model, "prompt": prompt, "max_tokens": 1}
    resp = await client.post(replica.url + "/v1/completions", json=body)
    assert resp.status_code == 200, resp.text


async def _ids(client: httpx.AsyncClient, fleet: VllmFleet, prompt: str) -> list[int]:
    resp = await client.post(
        fleet.replicas[0].url + "/tokenize", json={"model": fleet.model, "prompt": prompt}
    )
    assert resp.status_code == 200, resp.text
    ids: list[int] = resp.json()["tokens"]
    return ids


async def test_kv_events_fill_the_precise_index_and_eviction_empties_it(fleet: VllmFleet) -> None:
    async with gateway_for(fleet) as (gw, client), httpx.AsyncClient(timeout=60.0) as direct:
        await _sync_index(gw, fleet, direct)
        index = gw.runtime.affinity.prefixes
        prompt = f"kv index {time.monotonic_ns()} " + "juliet kilo lima mike " * 40
        ids = await _ids(direct, fleet, prompt)
        hashes = block_hashes(ids, fleet.block_size)
        assert len(hashes) >= 4
        resp = await client.post(
            "/v1/completions", json={"model": fleet.model, "prompt": prompt, "max_tokens": 1}
        )
        assert resp.status_code == 200, resp.text

        async def held() -> dict[str, int]:
            return {k: v for k, v in index.match(hashes).items() if v == len(hashes)}

        holders = await wait_until(held, "the prompt's blocks in the precise index", within=5.0)
        assert len(holders) == 1, holders
        (name,) = holders
        replica = next(r for r in fleet.replicas if r.name == name)
        assert index.mode(name) == "precise"

        # More unique tokens than the replica's cache holds: the prompt's blocks are evicted.
        filler_tokens = fleet.num_gpu_blocks * fleet.block_size * 3 // 2
        per_prompt = fleet.max_model_len - 2 * fleet.block_size
        for i in range(filler_tokens // per_prompt + 1):
            words = f"filler {i} {time.monotonic_ns()} " + "oscar papa quebec " * per_prompt
            text = _cut(await _ids(direct, fleet, words), per_prompt, words)
            await _complete(direct, replica, fleet, text)

        async def gone() -> bool:
            return name not in index.match(hashes)

        await wait_until(gone, "the evicted blocks to leave the index", within=5.0)
        assert index.mode(name) == "precise"


def _cut(ids: list[int], limit: int, words: str) -> str:
    """`words` cut to about `limit` tokens (the tokenizer makes ~1 token per short word)."""
    if len(ids) <= limit:
        return words
    return " ".join(words.split()[: limit * len(words.split()) // len(ids)])
