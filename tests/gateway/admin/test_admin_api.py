"""The admin API's contract: who may call it, validation as a [[replicas]] table, refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.config import ServerConfig
from gateway.http.app import GatewayApp
from gateway.runtime import Runtime
from simulator import SimFleet
from tests.gateway.admin.conftest import ADMIN_KEY, API_KEY, fleet_config
from tests.gateway.conftest import STORY, in_process

ROUTES = [
    ("GET", "/admin/replicas"),
    ("POST", "/admin/replicas"),
    ("DELETE", "/admin/replicas/sim-0"),
    ("POST", "/admin/replicas/sim-0/drain"),
    ("POST", "/admin/replicas/sim-0/undrain"),
    ("POST", "/admin/reload"),
]


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
async def keyed(fleet3: SimFleet) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    server = ServerConfig(port=0, api_keys=(API_KEY,), admin_keys=(ADMIN_KEY,))
    async with in_process(fleet_config(fleet3, server=server)) as gw:
        yield gw.runtime, gw.client


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_data_plane_keys_never_open_admin_routes(
    keyed: tuple[Runtime, httpx.AsyncClient], method: str, path: str
) -> None:
    runtime, c = keyed
    for headers in ({}, _bearer(API_KEY), _bearer("wrong")):
        r = await c.request(method, path, headers=headers, json={"url": "http://127.0.0.1:1"})
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["type"] == "AuthenticationError"
    # Nothing happened: not drained, not removed, not added.
    assert [r.name for r in runtime.pool] == ["sim-0", "sim-1"]
    assert not any(r.drained for r in runtime.pool)
    assert (await c.get("/admin/replicas", headers=_bearer(ADMIN_KEY))).status_code == 200


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_without_admin_keys_only_loopback_clients_get_in(
    fleet3: SimFleet, method: str, path: str
) -> None:
    server = ServerConfig(port=0, api_keys=(API_KEY,))
    runtime = Runtime(fleet_config(fleet3, server=server))
    await runtime.start()
    try:
        transport = httpx.ASGITransport(app=GatewayApp(runtime), client=("203.0.113.7", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            r = await c.request(method, path, headers=_bearer(API_KEY), json={})
            assert r.status_code == 403
            assert r.json()["error"]["type"] == "PermissionDeniedError"
        assert not any(r.drained for r in runtime.pool) and len(runtime.pool.replicas) == 2
    finally:
        await runtime.stop()


async def test_listing_shows_live_state(keyed: tuple[Runtime, httpx.AsyncClient]) -> None:
    _, c = keyed
    await c.post(
        "/v1/chat/completions",
        headers=_bearer(API_KEY),
        json={**STORY, "messages": [{"role": "user", "content": "hi " * 100}]},
    )
    r = await c.get("/admin/replicas", headers=_bearer(ADMIN_KEY))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    views = r.json()["replicas"]
    assert [v["name"] for v in views] == ["sim-0", "sim-1"]
    for v in views:
        assert v["origin"] == "config" and v["healthy"] and v["routable"]
        assert not v["probe_down"] and not v["drained"] and not v["ejected"]
        assert v["admit_fraction"] == 1.0 and v["in_flight"] == 0
        assert v["load"]["kv_usage"] is not None  # scraped at start
        assert v["last_scrape_age_s"] is not None and v["freshness"] > 0
        assert "sim-llama-3-8b" in v["models"]
        assert set(v["gpu"]) == {"mem_used_frac", "util", "age_s"}
    assert sum(v["requests_total"] for v in views) == 1
    assert sum(v["cached_blocks"] for v in views) > 0


async def test_added_replica_is_validated_as_a_replicas_table(
    keyed: tuple[Runtime, httpx.AsyncClient], fleet3: SimFleet
) -> None:
    runtime, c = keyed
    admin = _bearer(ADMIN_KEY)
    url = fleet3.replicas[2].url
    cases = [
        ({"name": "x"}, "replica.url: missing required key"),
        ({"url": url, "wieght": 2}, "replica.wieght: unknown key"),
        ({"url": url, "weight": "heavy"}, "replica.weight: expected number, got str"),
        ({"url": "ftp://nowhere"}, "url must be http(s)://host[:port]"),
        ({"url": url, "weight": -1}, "weight must be >= 0"),
    ]
    for body, message in cases:
        r = await c.post("/admin/replicas", headers=admin, json=body)
        assert r.status_code == 400, r.text
        assert message in r.json()["error"]["message"]
    assert (await c.post("/admin/replicas", headers=admin, content=b"{nope")).status_code == 400
    assert (await c.post("/admin/replicas", headers=admin, json=[url])).status_code == 400
    # Duplicates: a name or a url already served.
    taken = runtime.pool["sim-0"].config.url
    for body in ({"name": "sim-0", "url": url}, {"name": "other", "url": taken}):
        r = await c.post("/admin/replicas", headers=admin, json=body)
        assert r.status_code == 409, r.text
    assert len(runtime.pool.replicas) == 2
    r = await c.post("/admin/replicas", headers=admin, json={"url": url, "weight": 2})
    assert r.status_code == 201
    name = r.json()["added"]["name"]
    assert name == url.removeprefix("http://") and runtime.pool[name].config.weight == 2.0


async def test_unknown_replica_and_the_last_routable_one(
    keyed: tuple[Runtime, httpx.AsyncClient],
) -> None:
    runtime, c = keyed
    admin = _bearer(ADMIN_KEY)
    for method, path in ROUTES[2:5]:
        r = await c.request(method, path.replace("sim-0", "nope"), headers=admin)
        assert r.status_code == 404, (path, r.text)
    r = await c.delete("/admin/replicas/sim-0", headers=admin, params={"timeout_s": "x"})
    assert r.status_code == 400
    assert (await c.delete("/admin/replicas/sim-0", headers=admin)).json()["removed"] is True
    # sim-1 is the last routable replica: refused, unless forced.
    r = await c.delete("/admin/replicas/sim-1", headers=admin)
    assert r.status_code == 409 and "last routable" in r.json()["error"]["message"]
    assert not runtime.pool["sim-1"].drained  # a refused removal does not drain
    r = await c.delete("/admin/replicas/sim-1", headers=admin, params={"force": "true"})
    assert r.status_code == 200 and r.json()["removed"] is True
    assert runtime.pool.replicas == {}
    ready = await c.get("/ready")
    assert ready.status_code == 503


async def test_removal_whose_streams_outlast_the_wait_keeps_it_drained(
    fleet3: SimFleet,
) -> None:
    async with in_process(fleet_config(fleet3)) as gw:
        sim0 = gw.runtime.pool["sim-0"]
        lease = gw.runtime.pool.acquire("sim-0")  # a request that does not end in time
        try:
            removal = await gw.runtime.fleet.remove("sim-0", wait_s=0.2)
            assert removal.removed is False and removal.outcome == "timed_out_kept_drained"
            assert removal.in_flight == 1 and removal.waited_s >= 0.2
            assert sim0.drained and "sim-0" in gw.runtime.pool.replicas
            r = await gw.client.delete("/admin/replicas/sim-0", params={"timeout_s": "0.05"})
            assert r.status_code == 409 and r.json()["outcome"] == "timed_out_kept_drained"
            r = await gw.client.delete(
                "/admin/replicas/sim-0", params={"timeout_s": "0", "force": "1"}
            )
            assert r.status_code == 200 and r.json()["outcome"] == "removed_with_streams_open"
        finally:
            lease.release(True)  # ends after its replica left: nothing to record, no error
        assert "sim-0" not in gw.runtime.pool.replicas and sim0.in_flight == 0
