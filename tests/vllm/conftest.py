"""One real vLLM fleet (2 CPU replicas) per module, and gateways in front of it.

These tests always run, CI included: an engine that is missing or cannot start is a test
failure with the replica's log tail. `LLMGW_SKIP_VLLM=1` leaves them out on a developer's
machine without the engine; it is refused under CI.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from benchmarks.vllm_cpu import VllmFleet
from gateway.config import (
    CacheIndexConfig,
    GatewayConfig,
    HealthCheckConfig,
    ReplicaConfig,
    RoutingConfig,
    ScoreLoopConfig,
    ServerConfig,
)
from gateway.process import RunningGateway, running_gateway
from routing.profile import ProfileSpec
from tests.conformance.helpers import wait_for

if os.environ.get("LLMGW_SKIP_VLLM") == "1":
    if os.environ.get("CI"):
        raise pytest.UsageError("LLMGW_SKIP_VLLM=1 is not allowed in CI: the real vLLM tests run")
    collect_ignore_glob = ["test_*.py"]

# 96 blocks x 32 tokens per replica: a working set of a few thousand tokens overflows one
# replica but not the fleet of two. A 2048-token context lets one answer keep the engine
# busy for about 6 s, longer than vLLM's API server can trail its engine on 2 busy cores.
NUM_GPU_BLOCKS = 96
BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
# Covers the fleet's start-up (about 45 s alone, longer with two on two cores) in the first
# test of a module; each later test takes seconds.
TIMEOUT_S = 420


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def fleet() -> AsyncIterator[VllmFleet]:
    """Two real replicas shared by every test of the package (start-up is paid once)."""
    f = VllmFleet(
        2,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        startup_timeout_s=300.0,
    )
    async with f:
        yield f


def gateway_config(
    fleet: VllmFleet,
    profile: str = "default",
    kv_events: bool = True,
    profiles: dict[str, ProfileSpec] | None = None,
) -> GatewayConfig:
    """A gateway in front of `fleet` with its tokenizer and block size (precise index)."""
    return GatewayConfig(
        server=ServerConfig(port=0),
        health_check=HealthCheckConfig(interval_s=0.5, timeout_s=2.0),
        # The CPU engine shares 2 cores with the API server, whose /metrics can stall for
        # seconds while a step finishes (1.8 s measured): the default 0.5 s can lose the
        # scrapes taken while a replica is busy, the very ones these tests look for.
        score_loop=ScoreLoopConfig(scrape_timeout_s=5.0),
        routing=RoutingConfig(profile=profile, profiles=profiles or {}),
        cache_index=CacheIndexConfig(tokenizer=str(fleet.model_dir), block_size=fleet.block_size),
        replicas=tuple(
            ReplicaConfig(url=r.url, name=r.name, kv_events="auto" if kv_events else "")
            for r in fleet.replicas
        ),
    )


@asynccontextmanager
async def gateway_for(
    fleet: VllmFleet,
    profile: str = "default",
    kv_events: bool = True,
    profiles: dict[str, ProfileSpec] | None = None,
) -> AsyncIterator[tuple[RunningGateway, httpx.AsyncClient]]:
    """A started gateway (every replica healthy and its models known) and a client to it."""
    async with (
        running_gateway(gateway_config(fleet, profile, kv_events, profiles)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=60.0) as client,
    ):
        await wait_until(lambda: _all_healthy(gw), "every replica healthy at the gateway")
        yield gw, client


async def _all_healthy(gw: RunningGateway) -> bool:
    return all(r.healthy and r.models for r in gw.runtime.pool)


async def wait_until(
    probe: Callable[[], Awaitable[Any]], what: str, within: float = 15.0, interval: float = 0.05
) -> Any:
    """Poll `probe` until truthy (the conformance suite's poller, with real-vLLM deadlines)."""
    return await wait_for(probe, what, within=within, interval=interval)


async def metric(client: httpx.AsyncClient, url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` on a replica's /metrics that carry all of `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = (await client.get(url + "/metrics")).text
    except httpx.RemoteProtocolError:
        # A kept-alive connection the server closed as this request went out (seen once in
        # a full run: "Server disconnected without sending a response"): a new one answers.
        text = (await client.get(url + "/metrics")).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


async def reset_caches(fleet: VllmFleet, client: httpx.AsyncClient) -> None:
    """Empty every replica's prefix cache (refused while a request runs: retried)."""
    for r in fleet.replicas:

        async def reset(url: str = r.url) -> bool:
            r = await client.post(url + "/reset_prefix_cache")
            # vLLM answers 200 either way; {"success": false} while a request holds blocks.
            return r.status_code == 200 and r.json().get("success") is not False

        await wait_until(reset, f"/reset_prefix_cache on {r.name}")


ROOT = Path(__file__).resolve().parents[2]


async def run_conformance(
    env: Mapping[str, str], known: Mapping[str, str], *args: str, what: str
) -> str:
    """pytest `args` (conformance tests) in a subprocess against the real replicas `env`
    names (LLMGW_VLLM_*), the `known` differences deselected: its output, once it passed
    with nothing failed or skipped."""
    deselect = [a for t in known for a in ("--deselect", f"tests/conformance/{t}[vllm]")]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "-rs", *deselect,
        cwd=ROOT, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=TIMEOUT_S - 30)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"{what} failed:\n{text[-6000:]}"
    assert " passed" in text and " failed" not in text and "skipped" not in text, text[-2000:]
    return text
