"""Targets of the conformance suite.

``target``: the simulator by default; with ``LLMGW_VLLM_URL`` set, that real vLLM server
instead (``LLMGW_VLLM_MODEL``, ``LLMGW_VLLM_ZMQ`` (a connectable endpoint),
``LLMGW_VLLM_BLOCK_SIZE``, optional ``LLMGW_VLLM_LORA`` and ``LLMGW_VLLM_REPLAY``). Start it
with ``--enable-prompt-tokens-details``, ``--enable-server-load-tracking``, KV events and,
for /reset_prefix_cache, ``VLLM_SERVER_DEV_MODE=1``.
``pooling_target``: a pooling replica (vLLM ``--runner pooling --convert embed``): the
simulator with runner="pooling", or the real server at ``LLMGW_VLLM_POOLING_URL`` (model
``LLMGW_VLLM_POOLING_MODEL``). A run against a real generative server alone
(``LLMGW_VLLM_URL`` without ``LLMGW_VLLM_POOLING_URL``) deselects the tests that need one:
tests/vllm/test_pooling_vllm.py runs them against its own real pooling replica.
``audio_target``: a transcription replica (a Whisper model): the simulator with
runner="transcription", or the real server at ``LLMGW_VLLM_AUDIO_URL`` (model
``LLMGW_VLLM_AUDIO_MODEL``); deselected the same way without one
(tests/vllm/test_audio_vllm.py runs them against its own tiny Whisper).
``sim_target``: always the simulator; the fault tests use only this one.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from tests.conformance.helpers import Prompts, Target, scrape

SIM_LORA = "sim-lora"
SIM_EMBED = "sim-embed"
SIM_WHISPER = "sim-whisper"
SIM_BLOCK_SIZE = 16
SIM_NUM_GPU_BLOCKS = 64
SIM_MAX_MODEL_LEN = 512
# Large enough that every test runs in well under a second of simulated GPU time.
SIM_TIME_SCALE = 100.0


def sim_config(**overrides: Any) -> Any:
    from simulator import SimConfig

    fields: dict[str, Any] = {
        "lora_adapters": (SIM_LORA,),
        "block_size": SIM_BLOCK_SIZE,
        "num_gpu_blocks": SIM_NUM_GPU_BLOCKS,
        "max_model_len": SIM_MAX_MODEL_LEN,
        "time_scale": SIM_TIME_SCALE,
        "seed": 0,
        **overrides,
    }
    return SimConfig(**fields)


@asynccontextmanager
async def running_sim(config: Any) -> AsyncIterator[tuple[Target, Any]]:
    """A one-replica SimFleet and its Target; the replica handle is for the fault tests."""
    from simulator import SimFleet

    async with SimFleet(config, replicas=1, host="127.0.0.1", base_port=0) as fleet:
        replica = fleet.replicas[0]
        yield (
            Target(
                base_url=replica.url,
                model=config.model,
                lora=config.lora_adapters[0] if config.lora_adapters else None,
                zmq_endpoint=replica.kv_events_endpoint,
                block_size=config.block_size,
                max_model_len=config.max_model_len,
                kind="sim",
                replay_endpoint=replica.replay_endpoint,
            ),
            replica,
        )


async def vllm_target(url: str, model_env: str = "LLMGW_VLLM_MODEL") -> Target:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        models = (await client.get("/v1/models")).json()["data"]
        model = os.environ.get(model_env) or models[0]["id"]
        base = next(m for m in models if m["id"] == model)
        block_size = os.environ.get("LLMGW_VLLM_BLOCK_SIZE")
        if block_size is None:
            (labels, _), *_ = (await scrape(client)).series("vllm:cache_config_info")
            block_size = labels["block_size"]
    lora = os.environ.get("LLMGW_VLLM_LORA") or next(
        (m["id"] for m in models if m.get("parent") == model), None
    )
    return Target(
        base_url=url.rstrip("/"),
        model=model,
        lora=lora,
        zmq_endpoint=os.environ.get("LLMGW_VLLM_ZMQ"),
        block_size=int(block_size),
        max_model_len=int(base["max_model_len"]),
        kind="vllm",
        replay_endpoint=os.environ.get("LLMGW_VLLM_REPLAY"),
    )


def _target_kinds() -> list[str]:
    return ["vllm"] if os.environ.get("LLMGW_VLLM_URL") else ["sim"]


@pytest.fixture(params=_target_kinds())
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    if request.param == "vllm":
        yield await vllm_target(os.environ["LLMGW_VLLM_URL"])
        return
    async with running_sim(sim_config()) as (tgt, _):
        yield tgt


# The fixture of each other kind of replica, and the variable naming its real server.
_OTHER_REPLICAS = {
    "pooling_target": "LLMGW_VLLM_POOLING_URL",
    "audio_target": "LLMGW_VLLM_AUDIO_URL",
}


def _without_its_replica(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return any(f in names and not os.environ.get(v) for f, v in _OTHER_REPLICAS.items())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Deselected, not skipped: this run's real server is generative; another run covers these.
    if not os.environ.get("LLMGW_VLLM_URL"):
        return
    gone = [i for i in items if _without_its_replica(i)]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [i for i in items if i not in gone]


def _pooling_kinds() -> list[str]:
    return ["vllm"] if os.environ.get("LLMGW_VLLM_POOLING_URL") else ["sim"]


@pytest.fixture(params=_pooling_kinds())
async def pooling_target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    if request.param == "vllm":
        yield await vllm_target(os.environ["LLMGW_VLLM_POOLING_URL"], "LLMGW_VLLM_POOLING_MODEL")
        return
    config = sim_config(model=SIM_EMBED, runner="pooling", lora_adapters=(), kv_events=False)
    async with running_sim(config) as (tgt, _):
        yield tgt


@pytest.fixture
async def pooling_client(pooling_target: Target) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=pooling_target.base_url, timeout=30.0) as c:
        yield c


def _audio_kinds() -> list[str]:
    return ["vllm"] if os.environ.get("LLMGW_VLLM_AUDIO_URL") else ["sim"]


@pytest.fixture(params=_audio_kinds())
async def audio_target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    if request.param == "vllm":
        yield await vllm_target(os.environ["LLMGW_VLLM_AUDIO_URL"], "LLMGW_VLLM_AUDIO_MODEL")
        return
    config = sim_config(
        model=SIM_WHISPER, runner="transcription", lora_adapters=(), kv_events=False
    )
    async with running_sim(config) as (tgt, _):
        yield tgt


@pytest.fixture
async def audio_client(audio_target: Target) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=audio_target.base_url, timeout=30.0) as c:
        yield c


@pytest.fixture(params=["sim"])
async def sim_target(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Target, Any]]:
    async with running_sim(sim_config()) as pair:
        yield pair


@pytest.fixture
async def client(target: Target) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30.0) as c:
        yield c


@pytest.fixture
def prompts(request: pytest.FixtureRequest, target: Target) -> Prompts:
    # A real server keeps its prefix cache between runs: a nonce keeps prompts unseen.
    nonce = "" if target.kind == "sim" else f"run{time.time_ns()}"
    return Prompts(seed=request.node.nodeid, nonce=nonce)
