"""The admin dashboard in headless Chromium over real sockets, and the JSON it polls.

Debian's chromium, driven by Playwright (which downloads no browser here); a missing chromium
skips the browser tests locally and fails them in CI. DOM changes are awaited with
Playwright's polling assertions (a deadline, never a sleep).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright, expect

from gateway.admin.dashboard_summary import quantile
from gateway.config import GatewayConfig, ReplicaConfig, ServerConfig
from gateway.http.app import GatewayApp
from gateway.process import RunningGateway, running_gateway
from gateway.runtime import Runtime
from routing import PluginSpec
from simulator import SimFleet
from tests.gateway.admin.conftest import ADMIN_KEY, API_KEY
from tests.gateway.conftest import (
    MODEL,
    SIM,
    STORY,
    eventually,
    gateway_config,
    hold,
    holding,
    one_in_flight,
    set_faults,
)
from tests.system_programs import program

# In turn (every replica gets decisions), one request in flight each: with every replica
# holding a stream, the next request queues.
ONE_EACH = one_in_flight(PluginSpec("round_robin"))
# 4.5 ms a token: a held stream lasts ~18 s unless released, a short answer ~40 ms.
HELD = replace(SIM, time_scale=2.0)
HOLD = holding(4000)
# Rendered as text or not at all: any of it parsed as HTML would add elements or run script.
EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
# No "/" (a path segment), but every other character HTML and URLs treat specially.
ODD = '<i onclick=x>"a & b" #?%'
# Generous: two shared cores run the fleet, the gateway and the browser at once.
TIMEOUT_MS = 10_000


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    path = program("chromium")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


def watch(page: Page) -> list[str]:
    """Everything that went wrong on the page: console errors, exceptions, failed requests."""
    problems: list[str] = []
    page.on(
        "console",
        lambda m: (
            problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning")
            else None
        ),
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} {r.failure}"))
    page.on(
        "response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None
    )
    return problems


def row(page: Page, name: str) -> Locator:
    return page.locator("#replicas tbody tr[data-replica]").filter(
        has=page.locator(".replica-name", has_text=re.compile(f"^{re.escape(name)}$"))
    )


@contextlib.asynccontextmanager
async def _gateway(cfg: GatewayConfig) -> AsyncIterator[tuple[RunningGateway, httpx.AsyncClient]]:
    async with running_gateway(cfg) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        yield gw, c


async def test_page_shows_the_fleet_and_follows_drains(browser: Browser, tmp_path: Path) -> None:
    async with SimFleet(HELD, replicas=3, host="127.0.0.1", base_port=0) as fleet:
        cfg = gateway_config(fleet, routing=ONE_EACH)
        async with _gateway(cfg) as (gw, c):
            for _ in range(6):
                assert (await c.post("/v1/chat/completions", json=STORY)).status_code == 200
            page = await browser.new_page(viewport={"width": 1500, "height": 900})
            problems = watch(page)
            await page.goto(gw.url + "/admin/dashboard")
            for name in ("sim-0", "sim-1", "sim-2"):
                await expect(row(page, name)).to_have_count(1, timeout=TIMEOUT_MS)
                await expect(row(page, name).locator("td").nth(2)).to_have_text("routable")
                # Its share of the last decisions (two of six, in turn), from the summary route.
                await expect(row(page, name).locator("td").nth(10)).to_have_text("33.3%")
            routable = page.locator(".card", has_text="routable replicas").locator(".v")
            await expect(routable).to_have_text("3 / 3")
            await expect(page.locator("#branches tbody tr").first).not_to_have_text(
                "no decisions yet"
            )
            # Every replica busy: the next request waits in the admission queue, on the page.
            release = asyncio.Event()
            holders = [asyncio.create_task(hold(c, HOLD, release)) for _ in range(3)]
            await eventually(lambda: sum(r.in_flight for r in gw.runtime.pool) == 3)
            waiting = asyncio.create_task(c.post("/v1/chat/completions", json=STORY))
            queued = page.locator('#queue tbody tr[data-bucket="le128"] td').nth(2)
            await expect(queued).to_have_text("1", timeout=TIMEOUT_MS)
            await expect(page.locator(".card", has_text="queued").locator(".v")).to_have_text("1")
            await expect(row(page, "sim-0").locator("td").nth(3)).to_have_text("1")
            shot = tmp_path / "dashboard.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            if os.environ.get("DASHBOARD_SCREENSHOT"):  # how docs/dashboard.png is made
                shutil.copy(shot, os.environ["DASHBOARD_SCREENSHOT"])
            release.set()
            assert (await waiting).status_code == 200
            await asyncio.gather(*holders)
            await expect(queued).to_have_text("0", timeout=TIMEOUT_MS)

            # Drained through the API: the row follows within a poll or two.
            assert (await c.post("/admin/replicas/sim-1/drain")).status_code == 200
            await expect(row(page, "sim-1")).to_have_attribute(
                "data-drained", "true", timeout=TIMEOUT_MS
            )
            await expect(row(page, "sim-1").locator("td").nth(2)).to_have_text("drained")
            await expect(routable).to_have_text("2 / 3", timeout=TIMEOUT_MS)
            # Drained and undrained by the page's buttons: the gateway changes, then the row.
            await row(page, "sim-2").get_by_role("button", name="Drain").click()
            await eventually(lambda: gw.runtime.pool["sim-2"].drained, what="sim-2 drained")
            await expect(row(page, "sim-2")).to_have_attribute(
                "data-drained", "true", timeout=TIMEOUT_MS
            )
            await row(page, "sim-1").get_by_role("button", name="Undrain").click()
            await eventually(lambda: not gw.runtime.pool["sim-1"].drained, what="sim-1 back")
            await expect(row(page, "sim-1")).not_to_have_attribute(
                "data-drained", "true", timeout=TIMEOUT_MS
            )
            await expect(routable).to_have_text("2 / 3", timeout=TIMEOUT_MS)
            assert problems == []
            await page.close()


async def test_with_admin_keys_the_page_needs_the_key(browser: Browser, fleet: SimFleet) -> None:
    server = ServerConfig(port=0, api_keys=(API_KEY,), admin_keys=(ADMIN_KEY,))
    async with _gateway(gateway_config(fleet, server=server)) as (gw, c):
        html = (await c.get("/admin/dashboard")).text
        assert ADMIN_KEY not in html and 'data-auth="key"' in html
        page = await browser.new_page()
        problems = watch(page)
        sent: list[tuple[str, str | None]] = []
        page.on(
            "request",
            lambda r: (
                sent.append((r.url, r.headers.get("authorization")))
                if "/admin/" in r.url and not r.url.endswith("/admin/dashboard")
                else None
            ),
        )
        await page.goto(gw.url + "/admin/dashboard")
        # No key: a prompt, no data, and not even a refused request.
        await expect(page.locator("#auth-message")).to_have_text(
            re.compile("Enter the admin key"), timeout=TIMEOUT_MS
        )
        await expect(page.locator("#data")).to_be_hidden()
        assert await page.locator("#replicas tbody tr").count() == 0
        assert sent == [] and problems == []
        # A wrong key (or a data-plane one) is refused: still no data.
        for wrong in ("not-the-key", API_KEY):
            await page.fill("#key", wrong)
            await page.click("#use-key")
            await expect(page.locator("#auth-message")).to_have_text(
                re.compile("Admin key refused"), timeout=TIMEOUT_MS
            )
            await expect(page.locator("#data")).to_be_hidden()
            assert await page.locator("#replicas tbody tr").count() == 0
            # Both of the poll's requests went out with this key before the next is tried.
            await eventually(
                lambda w=wrong: sum(auth == f"Bearer {w}" for _, auth in sent) == 2,  # type: ignore[misc]
                what=f"both requests with {wrong}",
            )
        assert all(auth in ("Bearer not-the-key", f"Bearer {API_KEY}") for _, auth in sent)
        sent.clear()
        await page.fill("#key", ADMIN_KEY)
        await page.click("#use-key")
        for name in ("sim-0", "sim-1"):
            await expect(row(page, name)).to_have_count(1, timeout=TIMEOUT_MS)
        await expect(page.locator("#auth-section")).to_be_hidden()
        assert {auth for _, auth in sent} == {f"Bearer {ADMIN_KEY}"}
        # Kept for this tab: a reload shows the data without asking again.
        assert await page.evaluate("Object.values(sessionStorage)") == [ADMIN_KEY]
        await page.reload()
        await expect(row(page, "sim-0")).to_have_count(1, timeout=TIMEOUT_MS)
        # The button drains with the key too.
        await row(page, "sim-0").get_by_role("button", name="Drain").click()
        await eventually(lambda: gw.runtime.pool["sim-0"].drained, what="sim-0 drained")
        # Forgotten: the prompt again, and the data is gone from the page.
        await page.click("#forget")
        await expect(page.locator("#auth-message")).to_have_text("Key forgotten.")
        assert await page.locator("#replicas tbody tr").count() == 0
        assert await page.evaluate("sessionStorage.length") == 0
        await page.close()


async def test_replica_names_are_rendered_as_text(browser: Browser) -> None:
    async with SimFleet(SIM, replicas=2, host="127.0.0.1", base_port=0) as fleet:
        cfg = gateway_config(
            fleet,
            replicas=(
                ReplicaConfig(url=fleet.replicas[0].url, name=EVIL),
                ReplicaConfig(url=fleet.replicas[1].url, name=ODD),
            ),
        )
        async with _gateway(cfg) as (gw, c):
            for _ in range(3):  # one placement, then the same prompt follows its cache
                assert (await c.post("/v1/chat/completions", json=STORY)).status_code == 200
            picks = (await c.get("/admin/summary")).json()["decisions"]["by_replica"]
            ((served, served_picks),) = picks.items()  # whichever took the first
            assert served_picks == {"decisions": 3, "affinity": 2}
            other = ODD if served == EVIL else EVIL
            page = await browser.new_page()
            problems = watch(page)
            await page.goto(gw.url + "/admin/dashboard")
            await expect(page.locator("#replicas tbody tr[data-replica]")).to_have_count(
                2, timeout=TIMEOUT_MS
            )
            await expect(page.locator("#replicas .replica-name")).to_have_text([EVIL, ODD])
            # Its routing-side hit rate: two of its three decisions followed the prompt cache.
            await expect(row(page, served).locator("td").nth(11)).to_have_text("67%of 3")
            await expect(row(page, other).locator("td").nth(11)).to_have_text("\u2013of 0")
            injected = await page.evaluate(
                "document.querySelectorAll('#data script, #data img, #data i').length"
            )
            assert injected == 0
            assert await page.evaluate("window.__pwned") is None
            # The button's request names it exactly (escaped in the URL, not in the path).
            await row(page, ODD).get_by_role("button", name="Drain").click()
            await eventually(lambda: gw.runtime.pool[ODD].drained, what="odd name drained")
            await expect(row(page, ODD)).to_have_attribute(
                "data-drained", "true", timeout=TIMEOUT_MS
            )
            assert not gw.runtime.pool[EVIL].drained
            assert problems == []
            await page.close()


# --- the page's route and the summary, without a browser ---------------------------------


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def _asgi(runtime: Runtime, client: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=GatewayApp(runtime), client=(client, 4000))
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


async def test_page_route_auth_headers_and_redirect() -> None:
    async with SimFleet(SIM, replicas=1, host="127.0.0.1", base_port=0) as fleet:
        for keys in ((), (ADMIN_KEY,)):
            server = ServerConfig(port=0, api_keys=(API_KEY,), admin_keys=keys)
            runtime = Runtime(gateway_config(fleet, server=server))
            await runtime.start()
            try:
                async with await _asgi(runtime, "127.0.0.1") as local:
                    r = await local.get("/admin/dashboard")
                    assert r.status_code == 200
                    assert r.headers["content-type"] == "text/html; charset=utf-8"
                    assert ('data-auth="key"' in r.text) == bool(keys)
                    csp = r.headers["content-security-policy"]
                    for block in re.findall(r"<script>(.*?)</script>", r.text, re.DOTALL):
                        digest = base64.b64encode(hashlib.sha256(block.encode()).digest())
                        assert f"'sha256-{digest.decode()}'" in csp
                    assert "default-src 'none'" in csp and "unsafe-inline" not in csp
                    assert r.headers["cache-control"] == "no-store"
                    redirect = await local.get("/dashboard", headers={"host": "evil.example"})
                    assert redirect.status_code == 307
                    assert redirect.headers["location"] == "/admin/dashboard"
                    # The data behind the page: the admin keys, never a data-plane key.
                    for headers in ({}, _bearer(API_KEY)):
                        status = (await local.get("/admin/summary", headers=headers)).status_code
                        assert status == (401 if keys else 200)
                    ok = await local.get("/admin/summary", headers=_bearer(ADMIN_KEY))
                    assert ok.status_code == 200 and ok.json()["fleet"]["replicas"] == 1
                async with await _asgi(runtime, "203.0.113.7") as remote:
                    # Without admin keys, a remote client gets neither the page nor the data.
                    for path in ("/admin/dashboard", "/admin/summary"):
                        r = await remote.get(path)
                        assert r.status_code == (
                            200 if keys and "dashboard" in path else 401 if keys else 403
                        ), path
            finally:
                await runtime.stop()


async def test_summary_reports_totals_decisions_latency_queue_and_errors() -> None:
    async with (
        SimFleet(HELD, replicas=2, host="127.0.0.1", base_port=0) as fleet,
        _gateway(gateway_config(fleet, routing=ONE_EACH)) as (gw, c),
    ):
        for stream in (False, True, True, False):
            r = await c.post("/v1/chat/completions", json={**STORY, "stream": stream})
            assert r.status_code == 200
        s = (await c.get("/admin/summary")).json()
        assert s["profile"] == "one_each" and s["worker"] == {"index": 0, "count": 1}
        d = s["decisions"]
        assert d["window"] == 4 and sum(d["by_branch"].values()) == 4
        assert set(d["share"]) == {"sim-0", "sim-1"}
        # In turn, no cache tier followed (round robin has none).
        assert d["by_replica"] == {r: {"decisions": 2, "affinity": 0} for r in ("sim-0", "sim-1")}
        assert abs(sum(d["share"].values()) - 1.0) < 1e-9
        assert s["requests"]["by_status"] == {"200": 4} and s["requests"]["errors"] == 0
        assert s["errors"] == []
        ttft, duration = s["latency"]["ttft_s"], s["latency"]["duration_s"]
        assert ttft["count"] == 2 and 0 < ttft["p50"] <= ttft["p99"]  # the streams
        assert duration["count"] == 4 and 0 < duration["p50"] <= duration["p99"]
        # Both replicas busy: the next request waits in the admission queue.
        release = asyncio.Event()
        holders = [asyncio.create_task(hold(c, HOLD, release)) for _ in range(2)]
        await eventually(lambda: sum(r.in_flight for r in gw.runtime.pool) == 2)
        waiting = asyncio.create_task(c.post("/v1/chat/completions", json=STORY))
        assert gw.runtime.admission is not None
        await eventually(lambda: len(gw.runtime.admission.queue) == 1, what="one queued")
        s = (await c.get("/admin/summary")).json()
        f = s["fleet"]
        assert (f["replicas"], f["routable"], f["in_flight"], f["drained"]) == (2, 2, 2, 0)
        q = s["queue"]
        assert q["enabled"] and q["total"] == 1 and q["by_tenant"] == {"default": 1, "_other": 0}
        assert {"model": MODEL, "bucket": "le128", "depth": 1} in q["by_bucket"]
        assert s["decisions"]["window"] == 6  # the holders'; the queued one has none yet
        release.set()
        assert (await waiting).status_code == 200
        await asyncio.gather(*holders)
        # Failing replicas: their errors, and the 502 in the counts.
        await set_faults(fleet.replicas[0].url, error_rate=1.0, error_status=500)
        await set_faults(fleet.replicas[1].url, error_rate=1.0, error_status=500)
        assert (await c.post("/v1/chat/completions", json=STORY)).status_code == 502
        s = (await c.get("/admin/summary")).json()
        assert s["requests"]["errors"] == 1 and s["requests"]["by_status"]["502"] == 1
        assert s["requests"]["retries"] >= 1
        assert s["queue"]["admitted_after_wait"] == 1
        # Each replica failed once (a request never tries one twice); none was listed before.
        assert {e["replica"]: e["errors_total"] for e in s["errors"]} == {"sim-0": 1, "sim-1": 1}


def test_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (float("inf"), 40.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert quantile(0.25, buckets) == pytest.approx(0.1)
    assert quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (39.6 - 30) / 10)
    assert quantile(0.99, [(0.1, 1.0), (float("inf"), 10.0)]) == 0.1  # past the last bound
    assert quantile(0.5, []) is None and quantile(0.5, [(float("inf"), 0.0)]) is None
