"""Who may call which route: data-plane keys, admin keys, and loopback without admin keys."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from gateway.config import ServerConfig
from gateway.http.app import GatewayApp
from gateway.proxy.identity import is_loopback
from simulator import SimFleet
from tests.gateway.conftest import MODEL, InProcessGateway, gateway_config, in_process
from tests.gateway.http.errors import vllm_error

CLIENT_KEY, ADMIN_KEY = "client-key", "admin-key"
CREDENTIALS = {"none": {}, "client": {"authorization": f"Bearer {CLIENT_KEY}"}}
CREDENTIALS["admin"] = {"authorization": f"Bearer {ADMIN_KEY}"}
ROUTES = ("/health", "/ready", "/v1/models", "/metrics", "/admin/heartbeat", "/v1/completions")
BEAT = {
    "replica": "sim-0",
    "gpu_memory_used_bytes": 1,
    "gpu_memory_total_bytes": 4,
    "gpu_utilization": 0.25,
}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
REMOTE = ("203.0.113.7", 40000)  # TEST-NET-3: never this host


@asynccontextmanager
async def _gateway(
    fleet: SimFleet, api_keys: tuple[str, ...], admin_keys: tuple[str, ...]
) -> AsyncIterator[InProcessGateway]:
    server = ServerConfig(port=0, api_keys=api_keys, admin_keys=admin_keys)
    async with in_process(gateway_config(fleet, server=server)) as gw:
        yield gw


@asynccontextmanager
async def _remote(gw: InProcessGateway) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the same gateway calling from another host."""
    transport = httpx.ASGITransport(app=GatewayApp(gw.runtime), client=REMOTE)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        yield c


async def _call(c: httpx.AsyncClient, route: str, credential: str) -> int:
    headers = CREDENTIALS[credential]
    if route == "/admin/heartbeat":
        r = await c.post(route, json=BEAT, headers=headers)
    elif route == "/v1/completions":
        r = await c.post(route, json=COMPLETION, headers=headers)
    else:
        r = await c.get(route, headers=headers)
    if r.status_code in (401, 403):
        vllm_error(r, r.status_code)
    else:
        assert r.status_code < 300, (route, credential, r.status_code, r.text[:300])
    return r.status_code


async def _matrix(c: httpx.AsyncClient) -> dict[str, dict[str, str]]:
    """Route -> credential -> "ok" or the refusal's status."""
    result: dict[str, dict[str, str]] = {}
    for route in ROUTES:
        result[route] = {}
        for credential in CREDENTIALS:
            status = await _call(c, route, credential)
            result[route][credential] = str(status) if status in (401, 403) else "ok"
    return result


def _expect(**rows: str) -> dict[str, dict[str, str]]:
    """Expected outcomes, one "none client admin" string per route (unlisted: all ok)."""
    names = ("health", "ready", "models", "metrics", "admin", "completions")
    return {
        route: dict(zip(CREDENTIALS, rows.get(name, "ok ok ok").split(), strict=True))
        for route, name in zip(ROUTES, names, strict=True)
    }


async def test_without_any_keys_admin_routes_answer_loopback_only(fleet: SimFleet) -> None:
    async with _gateway(fleet, (), ()) as gw:
        assert await _matrix(gw.client) == _expect()
        async with _remote(gw) as remote:
            assert await _matrix(remote) == _expect(admin="403 403 403")


async def test_data_plane_keys_open_the_data_plane_only(fleet: SimFleet) -> None:
    async with _gateway(fleet, (CLIENT_KEY,), ()) as gw:
        async with _remote(gw) as remote:
            # /metrics stays open without admin keys (documented: keep the port private).
            assert await _matrix(remote) == _expect(
                models="401 ok 401", completions="401 ok 401", admin="403 403 403"
            )
        # Loopback still posts heartbeats (the sidecar), with or without a client key.
        assert (await _matrix(gw.client))["/admin/heartbeat"] == _expect()["/admin/heartbeat"]


async def test_admin_keys_alone_guard_admin_routes_and_metrics(fleet: SimFleet) -> None:
    async with _gateway(fleet, (), (ADMIN_KEY,)) as gw:
        want = _expect(metrics="401 401 ok", admin="401 401 ok")
        assert await _matrix(gw.client) == want  # loopback gets no pass once keys are set
        async with _remote(gw) as remote:
            assert await _matrix(remote) == want


async def test_both_kinds_of_keys_open_only_their_own_routes(fleet: SimFleet) -> None:
    async with _gateway(fleet, (CLIENT_KEY,), (ADMIN_KEY,)) as gw:
        want = _expect(
            models="401 ok 401",
            completions="401 ok 401",
            metrics="401 401 ok",
            admin="401 401 ok",
        )
        assert await _matrix(gw.client) == want
        async with _remote(gw) as remote:
            assert await _matrix(remote) == want


@pytest.mark.parametrize("admin_keys", [(), (ADMIN_KEY,)])
async def test_a_client_key_cannot_overwrite_gpu_figures(
    fleet: SimFleet, admin_keys: tuple[str, ...]
) -> None:
    async with _gateway(fleet, (CLIENT_KEY,), admin_keys) as gw:
        sim0 = gw.runtime.pool["sim-0"]
        before = (sim0.gpu_util, sim0.gpu_mem_used_frac)
        async with _remote(gw) as remote:
            r = await remote.post("/admin/heartbeat", json=BEAT, headers=CREDENTIALS["client"])
        error = vllm_error(r, 401 if admin_keys else 403)
        assert error["type"] == ("AuthenticationError" if admin_keys else "PermissionDeniedError")
        assert (sim0.gpu_util, sim0.gpu_mem_used_frac) == before
        if admin_keys:  # the admin key does apply it: the refusal was about the key
            async with _remote(gw) as remote:
                r = await remote.post("/admin/heartbeat", json=BEAT, headers=CREDENTIALS["admin"])
            assert r.status_code == 204 and sim0.gpu_util == 0.25


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("localhost", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback(host: str | None, ok: bool) -> None:
    assert is_loopback(host) is ok
