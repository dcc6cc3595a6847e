"""`--workers N`: real worker processes on one SO_REUSEPORT listener before a simulated fleet.

Every test starts its own supervisor (workers are `python -m gateway.workers` processes) and
stops it in a `finally`; connections are not kept alive, so the kernel spreads them.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import replace
from typing import cast

import aiohttp
import grpc
import httpx
import pytest

from gateway.cli import build_parser
from gateway.config import ReplicaConfig, ScoreLoopConfig, ServerConfig
from gateway.grpc.config import GrpcConfig
from gateway.grpc.gen import gateway_pb2 as pb
from gateway.grpc.gen import gateway_pb2_grpc as pb_grpc
from gateway.replicas.cadence import Bounds
from gateway.replicas.score_loop import ScoreLoop
from gateway.replicas.state import ReplicaState
from gateway.supervisor import (
    Supervisor,
    WorkerStartError,
    reserve,
    restart_delay,
    running_workers,
    worker_count,
)
from simulator import SimFleet
from tests.gateway.conftest import MODEL, SIM, STORY, eventually, gateway_config
from vllm_api.metrics import VllmMetrics

_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
ADMIN = "admin-key"
# A "python" that exits at once with status 1: a worker that cannot start.
_FALSE = shutil.which("false") or "/bin/false"


def _fresh() -> httpx.AsyncClient:
    # One connection per request: the kernel picks a worker for each.
    return httpx.AsyncClient(timeout=10.0, limits=httpx.Limits(max_keepalive_connections=0))


async def _scrape(url: str, key: str = "") -> list[tuple[str, dict[str, str], float]]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with _fresh() as c:
        r = await c.get(url + "/metrics", headers=headers)
    assert r.status_code == 200, r.text
    samples = []
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m, line
            samples.append((m[1], dict(_LABEL.findall(m[2] or "")), float(m[3])))
    return samples


def _by_worker(samples: list[tuple[str, dict[str, str], float]], name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for sample, labels, value in samples:
        if sample == name:
            out[labels["worker"]] = out.get(labels["worker"], 0.0) + value
    return out


async def _chat(url: str, n: int) -> list[int]:
    async with _fresh() as c:
        rs = await asyncio.gather(
            *(c.post(url + "/v1/chat/completions", json=STORY) for _ in range(n))
        )
    return [r.status_code for r in rs]


async def test_requests_spread_over_both_workers_and_any_scrape_counts_them_all(
    fleet: SimFleet,
) -> None:
    async with running_workers(gateway_config(fleet), 2) as sup:
        assert len({p for p in sup.pids() if p}) == 2
        assert await _chat(sup.url, 40) == [200] * 40
        # Each scrape lands on either worker: every one describes both.
        for _ in range(4):
            samples = await _scrape(sup.url)
            served = _by_worker(samples, "llm_gateway_requests_total")
            assert set(served) == {"0", "1"} and all(served.values()), served
            assert sum(served.values()) == 40
            assert ("llm_gateway_workers_reporting", {}, 2.0) in samples
            pids = {labels["pid"] for s, labels, _ in samples if s == "llm_gateway_worker_info"}
            assert pids == {str(p) for p in sup.pids()}


async def test_a_heartbeat_reaches_every_worker_and_stays_behind_the_admin_keys(
    fleet: SimFleet,
) -> None:
    cfg = gateway_config(fleet, server=ServerConfig(port=0, admin_keys=(ADMIN,)))
    name = fleet.replicas[0].name
    beat = {
        "replica": name,
        "gpu_memory_used_bytes": 30,
        "gpu_memory_total_bytes": 100,
        "gpu_utilization": 0.5,
    }
    async with running_workers(cfg, 2) as sup, _fresh() as c:
        r = await c.post(sup.url + "/admin/heartbeat", json=beat)
        assert r.status_code == 401
        assert (await c.get(sup.url + "/metrics")).status_code == 401
        gpu = _by_worker(await _scrape(sup.url, ADMIN), "gpu_vram_used_ratio")
        assert gpu == {}  # refused: reached no worker
        bad = await c.post(
            sup.url + "/admin/heartbeat",
            json={**beat, "gpu_utilization": 2.0},
            headers={"authorization": f"Bearer {ADMIN}"},
        )
        assert bad.status_code == 400
        assert _by_worker(await _scrape(sup.url, ADMIN), "gpu_vram_used_ratio") == {}
        r = await c.post(
            sup.url + "/admin/heartbeat", json=beat, headers={"authorization": f"Bearer {ADMIN}"}
        )
        assert r.status_code == 204
        # Applied by the worker it reached and handed to the other before the answer.
        gpu = _by_worker(await _scrape(sup.url, ADMIN), "gpu_vram_used_ratio")
        assert gpu == {"0": 0.3, "1": 0.3}


async def test_grpc_calls_succeed_on_both_workers(fleet: SimFleet) -> None:
    cfg = gateway_config(fleet, grpc=GrpcConfig(enabled=True, port=0))
    async with running_workers(cfg, 2) as sup:
        assert sup.grpc_port

        async def call() -> str:
            # A channel of its own connection (not the process-wide pool's): either worker.
            own = [("grpc.use_local_subchannel_pool", 1)]
            target = f"127.0.0.1:{sup.grpc_port}"
            async with grpc.aio.insecure_channel(target, options=own) as channel:
                request = pb.ChatRequest(
                    model=MODEL,
                    messages=[pb.ChatMessage(role="user", content="Tell me a story")],
                    max_tokens=8,
                )
                stub = pb_grpc.InferenceStub(channel)  # type: ignore[no-untyped-call]
                reply = await stub.Chat(request, timeout=10)
                return str(reply.choices[0].message.content)

        answers = await asyncio.gather(*(call() for _ in range(16)))
        assert all(answers)
        served = _by_worker(await _scrape(sup.url), "llm_gateway_requests_total")
        assert set(served) == {"0", "1"} and sum(served.values()) == 16, served


async def test_a_killed_worker_fails_only_its_clients_and_is_restarted() -> None:
    # Real-time clock: ~10 ms a token, so every stream is running when the worker dies.
    async with (
        SimFleet(replace(SIM, time_scale=1.0), replicas=2) as fleet,
        running_workers(gateway_config(fleet), 2) as sup,
    ):
        victim, survivor = sup.pids()
        assert victim and survivor
        body = {**STORY, "max_tokens": 250, "ignore_eos": True, "stream": True}
        streams_open = asyncio.Semaphore(0)

        async def stream() -> str:
            text = ""
            try:
                async with (
                    _fresh() as c,
                    c.stream("POST", sup.url + "/v1/chat/completions", json=body) as r,
                ):
                    async for chunk in r.aiter_text():
                        if not text:
                            streams_open.release()
                        text += chunk
            except httpx.HTTPError:
                return "error"
            return "done" if text.endswith("data: [DONE]\n\n") else "cut"

        streams = [asyncio.create_task(stream()) for _ in range(16)]
        for _ in streams:  # every stream has its first bytes: all are on some worker
            await asyncio.wait_for(streams_open.acquire(), 10)
        os.kill(victim, signal.SIGKILL)
        # Never a hang: the victim's clients get an error, the survivor's their whole answer.
        outcomes = await asyncio.wait_for(asyncio.gather(*streams), 15)
        assert set(outcomes) == {"done", "error"}, outcomes
        # New connections go to the listeners still open while the victim restarts.
        assert await _chat(sup.url, 10) == [200] * 10
        await eventually(lambda: sup.pids()[0] not in (None, victim), 15, "a restart")
        assert sup.pids()[1] == survivor and sup.restarts == [1, 0]
        assert await _chat(sup.url, 30) == [200] * 30
        samples = await _scrape(sup.url)
        assert _by_worker(samples, "llm_gateway_worker_restarts_total") == {"0": 1.0, "1": 0.0}
        info = {labels["worker"]: labels["pid"] for s, labels, _ in samples if "info" in s}
        assert info == {"0": str(sup.pids()[0]), "1": str(survivor)}
        # The new process counts from zero: what it served came after its start.
        assert _by_worker(samples, "llm_gateway_requests_total")["0"] > 0


async def test_a_worker_that_cannot_start_fails_the_start_and_frees_the_port(
    fleet: SimFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", _FALSE)  # every worker exits at once, status 1
    sup = Supervisor(gateway_config(fleet), 2)
    with pytest.raises(WorkerStartError, match="exited during start-up"):
        await sup.start()
    reserve("127.0.0.1", int(sup.url.rsplit(":", 1)[1])).close()  # nobody holds it now


async def test_a_crash_looping_worker_backs_off_and_never_stops_the_others(
    fleet: SimFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_workers(gateway_config(fleet), 2) as sup:
        victim, survivor = sup.pids()
        assert victim
        # From now on the slot's restarts fail at once, as a worker crashing at start-up.
        monkeypatch.setattr(sys, "executable", _FALSE)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        await eventually(lambda: sup.restarts[0] >= 4, 10, "four failed restarts")
        # Backing off (0.1 + 0.2 + 0.4 s before the fourth), not a tight loop.
        assert time.monotonic() - killed_at >= 0.7
        assert await _chat(sup.url, 10) == [200] * 10
        assert sup.pids() == [None, survivor]
        monkeypatch.undo()
        await eventually(lambda: sup.pids()[0] is not None, 15, "a restart that serves")
        assert sup.pids()[1] == survivor


def test_a_port_another_process_listens_on_is_refused() -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError):
            reserve("127.0.0.1", busy.getsockname()[1])


def test_a_reserved_port_accepts_no_connection() -> None:
    held = reserve("127.0.0.1", 0)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(held.getsockname(), timeout=2).close()
    finally:
        held.close()


def test_restart_backoff_grows_and_is_bounded() -> None:
    delays = [restart_delay(n) for n in range(1, 20)]
    assert delays[0] == pytest.approx(0.1)
    assert delays == sorted(delays) and max(delays) == 5.0


def test_worker_count_and_the_cli_flag() -> None:
    assert worker_count(3) == 3 and worker_count(0) == (os.cpu_count() or 1)
    args = build_parser(["serve"]).parse_args(["serve", "-c", "x.toml", "--workers", "auto"])
    assert args.workers == 0
    assert build_parser(["demo"]).parse_args(["demo", "--workers", "2"]).workers == 2
    for bad in ("0", "-1", "many"):
        with pytest.raises(SystemExit):
            build_parser(["serve"]).parse_args(["serve", "-c", "x.toml", "--workers", bad])
    with pytest.raises(ValueError, match="workers"):
        ServerConfig(workers=-1)


class _Refused:
    def get(self, url: str, **_: object) -> None:
        raise aiohttp.ClientConnectionError(url)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_workers_on_one_host_split_each_replicas_scrape_budget(workers: int) -> None:
    cfg = ScoreLoopConfig()
    assert Bounds.of(cfg, workers).max_per_s == cfg.max_scrapes_per_s / workers
    loop = ScoreLoop(
        cfg, cast(aiohttp.ClientSession, _Refused()), lambda _n, _b: None, workers=workers
    )
    r = ReplicaState(ReplicaConfig(url="http://r0.test:8000", name="r0"))
    # Other clients' load flips at every scrape: the cadence always wants the fastest.
    t, starts = 0.0, []
    for i in range(400):
        loop.record(r, VllmMetrics(running=5.0 * (i % 2), waiting=0.0), t)
        t = loop.due(r, t)
        pace = loop._paces[r.name]
        pace.budget, pace.last_attempt = pace.budget.spend(loop._bounds, t), t
        starts.append(t)
        if t > 120.0:
            break
    scraped = sum(1 for s in starts if s <= 120.0)
    bounds = Bounds.of(cfg, workers)
    # Each worker its share: N workers together scrape a replica as often as one did.
    assert scraped <= bounds.burst + 120.0 * cfg.max_scrapes_per_s / workers + 1
    assert scraped >= 120.0 * cfg.max_scrapes_per_s / workers - 1
