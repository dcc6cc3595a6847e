"""Hot reload under streaming load: a good file applies its diff, a bad one changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from gateway.config import load_config
from gateway.process import RunningGateway, running_gateway
from simulator import SimFleet
from tests.gateway.admin.conftest import started
from tests.gateway.admin.load import StreamingLoad
from tests.gateway.conftest import STORY, eventually

ZONE_B = """
[routing.profiles.zone_b]
filters = [{ type = "healthy" }, { type = "serves_model" },
           { type = "label", params = { key = "zone", value = "b" } }]
picker = { type = "round_robin" }
"""


_NO_SLOW_START = "\n[discovery]\nslow_start = false\n"


def _toml(
    fleet: SimFleet,
    names: list[str],
    api_keys: list[str],
    admin_keys: list[str],
    profile: str = "round_robin",
    port: int = 0,
    extra: str = "",
) -> str:
    replicas = "".join(
        f'[[replicas]]\nname = "{r.name}"\nurl = "{r.url}"\nlabels = {{ zone = "'
        f'{"b" if r.name == "sim-2" else "a"}" }}\n\n'
        for r in fleet.replicas
        if r.name in names
    )
    return (
        f"[server]\nport = {port}\ndrain_timeout_s = 10.0\n"
        f"api_keys = {api_keys!r}\nadmin_keys = {admin_keys!r}\n\n"
        "[health_check]\ninterval_s = 0.1\ntimeout_s = 0.5\n\n"
        f'[routing]\nprofile = "{profile}"\n{ZONE_B}\n{extra}\n{replicas}'
    ).replace("'", '"')


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@contextlib.asynccontextmanager
async def _gateway(path: Path) -> AsyncIterator[RunningGateway]:
    async with running_gateway(load_config(path)) as gw:
        gw.runtime.config_path = str(path)
        yield gw


async def test_good_file_applies_replicas_keys_and_routing_under_load(
    fleet3: SimFleet, tmp_path: Path
) -> None:
    path = tmp_path / "gw.toml"
    first = _toml(
        fleet3, ["sim-0", "sim-1"], ["sk-keep", "sk-old"], ["adm-1"], extra=_NO_SLOW_START
    )
    path.write_text(first)
    async with _gateway(path) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        runtime, pool = gw.runtime, gw.runtime.pool
        async with StreamingLoad(gw.url, headers=_auth("sk-keep")) as load:
            await load.wait_for(10)
            await eventually(lambda: pool["sim-0"].in_flight > 0, what="streams on sim-0")
            path.write_text(
                _toml(
                    fleet3,
                    ["sim-1", "sim-2"],
                    ["sk-keep", "sk-new"],
                    ["adm-2"],
                    profile="zone_b",
                    port=18123,
                    # At once its full share: the new profile routes to it alone.
                    extra="[upstream]\nmax_retries = 1\n" + _NO_SLOW_START,
                ).replace("interval_s = 0.1", "interval_s = 0.2")
            )
            r = await c.post("/admin/reload", headers=_auth("adm-1"))
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["changed"] is True
            assert body["replicas"] == {
                "added": ["sim-2"],
                "removed": ["sim-0"],
                "replaced": [],
                "failed": [],
            }
            assert set(body["applied"]) == {
                "server.api_keys",
                "server.admin_keys",
                "routing.profile",
                "upstream.max_retries",
            }
            assert set(body["restart_required"]) == {"server.port", "health_check.interval_s"}
            # Removed only once its streams were done; the rest is live at once.
            assert "sim-0" not in pool.replicas
            assert runtime.router.profile_name == "zone_b"
            assert runtime.config.upstream.max_retries == 1
            # The pipeline reads its per-request [upstream] keys from here.
            assert runtime.pipeline._cfg is runtime.config.upstream
            assert runtime.config.server.port == 0  # needs a restart: kept
            assert runtime.config.health_check.interval_s == 0.1
            sim1, sim2 = pool["sim-1"], pool["sim-2"]
            before1, before2 = started(sim1), started(sim2)
            # The new router places every new request on zone b (counted by starts: a
            # completion may be of a stream that started before `before2` was read).
            await eventually(
                lambda: started(sim2) >= before2 + 20, timeout=20.0, what="20 starts on sim-2"
            )
            assert started(sim1) == before1
        load.check()
        chat = {**STORY, "max_tokens": 2}
        assert (
            await c.post("/v1/chat/completions", json=chat, headers=_auth("sk-old"))
        ).status_code == 401
        assert (
            await c.post("/v1/chat/completions", json=chat, headers=_auth("sk-new"))
        ).status_code == 200
        assert (await c.get("/admin/replicas", headers=_auth("adm-1"))).status_code == 401
        views = (await c.get("/admin/replicas", headers=_auth("adm-2"))).json()["replicas"]
        assert [(v["name"], v["origin"]) for v in views] == [
            ("sim-1", "config"),
            ("sim-2", "config"),
        ]
        # The same file again: nothing more to do, the restart-only keys still reported.
        again = (await c.post("/admin/reload", headers=_auth("adm-2"))).json()
        assert again["changed"] is False and again["applied"] == []
        assert set(again["restart_required"]) == {"server.port", "health_check.interval_s"}


async def test_bad_file_changes_nothing_and_names_the_key(fleet3: SimFleet, tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    good = _toml(fleet3, ["sim-0", "sim-1"], ["sk-keep"], [])
    path.write_text(good)
    async with _gateway(path) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        runtime = gw.runtime
        router, config = runtime.router, runtime.config
        bad_files = [
            (
                good.replace("[upstream]", "") + "\n[upstream]\nmax_retrys = 1\n",
                "upstream.max_retrys: unknown key",
            ),
            (
                good.replace('profile = "round_robin"', 'profile = "nope"'),
                "routing.profile: unknown profile 'nope'",
            ),
            (
                good.replace("interval_s = 0.1", "interval_s = -1.0"),
                "health_check: interval_s must be > 0",
            ),
            (good.replace('name = "sim-1"', 'name = "sim-0"'), "duplicate replica names: sim-0"),
            (good + "\n[[replicas]]\nurl = 7\n", "replicas[2].url: expected string, got int"),
            ("[server\n", "invalid TOML"),
        ]
        async with StreamingLoad(gw.url, headers=_auth("sk-keep")) as load:
            await load.wait_for(5)
            for text, message in bad_files:
                path.write_text(text)
                r = await c.post("/admin/reload")
                assert r.status_code == 400, r.text
                assert message in r.json()["error"]["message"], r.text
                assert runtime.router is router and runtime.config is config
                assert [r.name for r in runtime.pool] == ["sim-0", "sim-1"]
            await load.wait_for(10)
        load.check()
        # A url already served by a replica the file does not own (added through the API).
        sim2 = fleet3.replicas[2]
        assert (
            await c.post("/admin/replicas", json={"name": "extra", "url": sim2.url})
        ).status_code == 201
        path.write_text(good + f'\n[[replicas]]\nname = "other"\nurl = "{sim2.url}"\n')
        r = await c.post("/admin/reload")
        assert r.status_code == 400
        assert "replicas[2].url" in r.json()["error"]["message"]
        assert sorted(runtime.pool.replicas) == ["extra", "sim-0", "sim-1"]
        runtime.config_path = None
        r = await c.post("/admin/reload")
        assert r.status_code == 400 and "not started from a configuration file" in r.text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _replica_names(c: httpx.AsyncClient) -> list[str]:
    r = await c.get("/admin/replicas")
    return [v["name"] for v in r.json()["replicas"]]


async def test_sighup_reloads_a_served_file(fleet3: SimFleet, tmp_path: Path) -> None:
    port = _free_port()
    path = tmp_path / "gw.toml"
    path.write_text(_toml(fleet3, ["sim-0"], [], [], port=port))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "--log-level", "info", "serve", "-c", str(path),
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []

    async def read_log() -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            lines.append(raw.decode())

    reader = asyncio.create_task(read_log())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as c:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await c.get("/ready")).status_code == 200:
                        break
                assert proc.returncode is None and time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert await _replica_names(c) == ["sim-0"]
            path.write_text("[server]\nport = 'x'\n")
            proc.send_signal(signal.SIGHUP)
            await eventually(
                lambda: any("reload refused, nothing changed" in ln for ln in lines),
                timeout=10.0,
                what="the refusal logged",
            )
            assert any("server.port: expected integer, got str" in ln for ln in lines)
            assert await _replica_names(c) == ["sim-0"]
            path.write_text(_toml(fleet3, ["sim-0", "sim-2"], [], [], port=port))
            proc.send_signal(signal.SIGHUP)
            names: list[str] = []
            deadline = time.monotonic() + 10
            while names != ["sim-0", "sim-2"]:
                assert time.monotonic() < deadline, names
                names = await _replica_names(c)
            r = await c.post("/v1/chat/completions", json={**STORY, "max_tokens": 2})
            assert r.status_code == 200
        assert any("replica sim-2 added (config)" in ln for ln in lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), timeout=30)
        reader.cancel()


async def test_reload_applies_tenant_quotas(fleet3: SimFleet, tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    base = _toml(fleet3, ["sim-0", "sim-1"], [], [])
    tenant = '\n[tenancy.tenants.acme]\nkeys = ["sk-acme"]\n'
    path.write_text(base + tenant)
    chat = {**STORY, "max_tokens": 2}
    async with _gateway(path) as gw, httpx.AsyncClient(base_url=gw.url, timeout=10.0) as c:
        for _ in range(3):  # unlimited
            r = await c.post("/v1/chat/completions", json=chat, headers=_auth("sk-acme"))
            assert r.status_code == 200
        path.write_text(base + tenant + "requests_per_minute = 1\n")
        body = (await c.post("/admin/reload")).json()
        assert body["applied"] == ["tenancy.tenants.acme"]
        assert (
            await c.post("/v1/chat/completions", json=chat, headers=_auth("sk-acme"))
        ).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat, headers=_auth("sk-acme"))
        assert r.status_code == 429 and "requests_per_minute" in r.text


async def test_a_changed_replica_table_is_replaced_after_its_drain(
    fleet3: SimFleet, tmp_path: Path
) -> None:
    path = tmp_path / "gw.toml"
    base = _toml(fleet3, ["sim-0", "sim-1"], [], [], extra=_NO_SLOW_START)
    path.write_text(base)
    async with _gateway(path) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30.0) as c:
        pool = gw.runtime.pool
        old = pool["sim-1"]
        async with StreamingLoad(gw.url) as load:
            await eventually(lambda: old.in_flight > 0, what="streams on sim-1")
            path.write_text(base.replace('zone = "a" }\n\n', 'zone = "a" }\nweight = 3.0\n\n'))
            body = (await c.post("/admin/reload")).json()
            assert body["replicas"]["replaced"] == ["sim-0", "sim-1"], body
            assert old.in_flight == 0 and old.drained  # the old state finished, then left
            assert pool["sim-1"] is not old and pool["sim-1"].config.weight == 3.0
            await load.wait_for(10)
        load.check()
