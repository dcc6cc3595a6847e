"""`llm-gateway agent`: heartbeats reach every gateway, only with the admin key."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from dataclasses import replace

import aiohttp
import pytest

from gateway.agent import Agent, AgentError, AgentSettings, GpuSample, NvmlReader, settings_from
from gateway.config import ServerConfig
from gateway.process import running_gateway
from simulator import SimFleet
from tests.gateway.conftest import gateway_config

GIB = 1 << 30


class _Gpus:
    """The replica's GPUs as NVML would report them (this machine has none)."""

    def __init__(self, sample: GpuSample) -> None:
        self.sample = sample
        self.reads: list[tuple[int, ...]] = []

    def read(self, indices: tuple[int, ...]) -> GpuSample:
        self.reads.append(indices)
        return self.sample


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_heartbeats_reach_every_gateway_and_need_the_admin_key(fleet: SimFleet) -> None:
    base = gateway_config(fleet)
    cfg = replace(base, server=replace(base.server, admin_keys=("admin-secret",)))
    name = fleet.replicas[0].name
    gpus = _Gpus(GpuSample(used_bytes=30 * GIB, total_bytes=80 * GIB, utilization=0.75))
    async with (
        running_gateway(cfg) as gw1,
        running_gateway(cfg) as gw2,
        aiohttp.ClientSession() as session,
    ):
        down = f"http://127.0.0.1:{_closed_port()}"
        good = AgentSettings(
            gateways=(gw1.url, gw2.url, down),
            replica=name,
            gpu_indices=(0, 1),
            admin_key="admin-secret",
        )
        agent = Agent(good, gpus, session)
        await agent.beat()
        # Both live gateways took it; the unreachable one is recorded, and stops nothing.
        assert agent.last_status == {gw1.url: 204, gw2.url: 204, down: 0}
        assert gpus.reads == [(0, 1)]
        for gw in (gw1, gw2):
            replica = gw.runtime.pool[name]
            assert replica.gpu_mem_used_frac == pytest.approx(30 / 80)
            assert replica.gpu_util == pytest.approx(0.75)

        # A wrong key, or none: refused, and the gateways' figures stay as they were.
        gpus.sample = GpuSample(used_bytes=79 * GIB, total_bytes=80 * GIB, utilization=1.0)
        for key in ("wrong", ""):
            bad = Agent(replace(good, gateways=(gw1.url,), admin_key=key), gpus, session)
            await bad.beat()
            assert bad.last_status == {gw1.url: 401}
            assert bad.sent == 0
        assert gw1.runtime.pool[name].gpu_mem_used_frac == pytest.approx(30 / 80)


async def test_a_replica_the_gateway_does_not_know_is_refused(fleet: SimFleet) -> None:
    cfg = gateway_config(fleet, server=ServerConfig(port=0))
    gpus = _Gpus(GpuSample(1, 2, 0.5))
    async with running_gateway(cfg) as gw, aiohttp.ClientSession() as session:
        # No admin keys: loopback may post (a sidecar agent), but only for a configured replica.
        agent = Agent(AgentSettings(gateways=(gw.url,), replica="nobody"), gpus, session)
        await agent.beat()
        assert agent.last_status == {gw.url: 400}
        ok = Agent(AgentSettings(gateways=(gw.url,), replica=fleet.replicas[1].name), gpus, session)
        await ok.beat()
        assert ok.last_status == {gw.url: 204}


def test_settings_come_from_flags_and_the_key_from_the_environment() -> None:
    args = argparse.Namespace(
        gateway=["http://a:8000", "http://b:8000"],
        replica="r0",
        gpus="0,2",
        interval_s=0.5,
        timeout_s=1.0,
        vllm_url="http://127.0.0.1:8001",
    )
    s = settings_from(args, {"LLM_GATEWAY_ADMIN_KEY": "k"})
    assert s.vllm_url == "http://127.0.0.1:8001"
    assert (s.gateways, s.gpu_indices, s.admin_key, s.interval_s) == (
        ("http://a:8000", "http://b:8000"),
        (0, 2),
        "k",
        0.5,
    )
    with pytest.raises(AgentError, match="--gpus"):
        settings_from(argparse.Namespace(**{**vars(args), "gpus": "x"}), {})
    with pytest.raises(AgentError, match="--gpus"):
        AgentSettings(gateways=("http://a",), replica="r0", gpu_indices=())
    with pytest.raises(AgentError, match="interval"):
        AgentSettings(gateways=("http://a",), replica="r0", interval_s=0)


def test_nvml_reads_the_gpus_or_says_why_not() -> None:
    try:
        reader = NvmlReader()
    except AgentError as exc:  # no driver here (no GPU on this host)
        assert "NVML unavailable" in str(exc)
        return
    sample = reader.read((0,))
    assert 0 < sample.used_bytes <= sample.total_bytes
    assert 0.0 <= sample.utilization <= 1.0


def test_the_agent_command_exits_2_when_it_cannot_start() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "agent",
            "--gateway",
            "http://127.0.0.1:9",
            "--replica",
            "r0",
            "--gpus",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--gpus must list integers" in proc.stderr


async def test_without_a_gpu_heartbeats_carry_the_replicas_liveness(fleet: SimFleet) -> None:
    base = gateway_config(fleet)
    cfg = replace(base, server=replace(base.server, admin_keys=("admin-secret",)))
    replica = fleet.replicas[1]
    async with running_gateway(cfg) as gw, aiohttp.ClientSession() as session:
        settings = AgentSettings(
            gateways=(gw.url,), replica=replica.name, admin_key="admin-secret",
            vllm_url=replica.url,
        )  # fmt: skip
        agent = Agent(settings, None, session)  # no GPU reader on this host
        await agent.beat()
        assert agent.last_status == {gw.url: 204}
        state = gw.runtime.pool[replica.name]
        assert state.agent_vllm_healthy is True and state.gpu_mem_used_frac is None
        # The replica stops answering: the next heartbeat says so.
        dead = replace(settings, vllm_url=f"http://127.0.0.1:{_closed_port()}")
        await Agent(dead, None, session).beat()
        assert state.agent_vllm_healthy is False
        async with session.get(
            f"{gw.url}/admin/replicas", headers={"authorization": "Bearer admin-secret"}
        ) as resp:
            rows = {r["name"]: r for r in (await resp.json())["replicas"]}
        assert rows[replica.name]["agent"]["vllm_healthy"] is False


async def test_a_heartbeat_with_neither_gpu_figures_nor_liveness_is_refused(
    fleet: SimFleet,
) -> None:
    async with running_gateway(gateway_config(fleet)) as gw, aiohttp.ClientSession() as s:
        name = fleet.replicas[0].name
        for body in ({"replica": name}, {"replica": name, "vllm_healthy": "yes"}):
            async with s.post(f"{gw.url}/admin/heartbeat", json=body) as resp:
                assert resp.status == 400, body
