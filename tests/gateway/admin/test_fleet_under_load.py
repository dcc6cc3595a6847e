"""Add, drain and remove replicas through the admin API while streams run: none dropped."""

from __future__ import annotations

import time

import httpx

from gateway.admin.config import DiscoveryConfig
from gateway.process import running_gateway
from simulator import SimFleet
from tests.gateway.admin.conftest import fleet_config, started
from tests.gateway.admin.load import StreamingLoad
from tests.gateway.conftest import eventually


async def test_drain_routes_nothing_new_while_its_streams_finish(fleet3: SimFleet) -> None:
    async with (
        running_gateway(fleet_config(fleet3)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=10.0) as admin,
    ):
        sim0 = gw.runtime.pool["sim-0"]
        async with StreamingLoad(gw.url) as load:
            await load.wait_for(10)
            await eventually(lambda: sim0.in_flight > 0, what="streams open on sim-0")
            r = await admin.post("/admin/replicas/sim-0/drain")
            assert r.status_code == 200
            assert r.json()["changed"] is True and r.json()["replica"]["drained"] is True
            at_drain, open_at_drain = started(sim0), sim0.in_flight
            assert open_at_drain > 0
            await load.wait_for(30)
            # Its open streams ended (completed: load.check), and not one request more came.
            assert started(sim0) == at_drain and sim0.in_flight == 0
            listing = (await admin.get("/admin/replicas")).json()["replicas"]
            assert [v["drained"] for v in listing] == [True, False]
            assert listing[0]["routable"] is False and listing[0]["healthy"] is True
            metrics = (await admin.get("/metrics")).text
            assert 'llm_gateway_replica_drained{replica="sim-0"} 1.0' in metrics
            assert 'llm_gateway_replica_drained{replica="sim-1"} 0.0' in metrics
            # Draining twice changes nothing; undrained, it takes requests again.
            assert (await admin.post("/admin/replicas/sim-0/drain")).json()["changed"] is False
            r = await admin.post("/admin/replicas/sim-0/undrain")
            assert r.json()["changed"] is True and r.json()["replica"]["routable"] is True
            await eventually(lambda: started(sim0) > at_drain + 5, what="sim-0 routed again")
        load.check()
        metrics = (await admin.get("/metrics")).text
        assert 'llm_gateway_replica_drained{replica="sim-0"} 0.0' in metrics


async def test_add_then_remove_under_load_drops_no_stream(fleet3: SimFleet) -> None:
    # A full share at once (the ramp has its own test): its streams come quickly.
    cfg = fleet_config(fleet3, discovery=DiscoveryConfig(slow_start=False))
    new = fleet3.replicas[2]
    async with (
        running_gateway(cfg) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30.0) as admin,
    ):
        pool = gw.runtime.pool
        async with StreamingLoad(gw.url, clients=9) as load:
            await load.wait_for(10)
            r = await admin.post(
                "/admin/replicas",
                json={"name": "sim-2", "url": new.url, "labels": {"zone": "b"}},
            )
            assert r.status_code == 201, r.text
            added = r.json()["added"]
            assert added["origin"] == "admin" and added["labels"] == {"zone": "b"}
            assert added["healthy"] is True and added["models"]
            sim2 = pool["sim-2"]
            # Its loops run: probes and scrapes keep coming.
            scrapes = sim2.scrapes_total
            await eventually(lambda: sim2.scrapes_total > scrapes, what="sim-2 scraped again")
            await eventually(lambda: started(sim2) >= 5, timeout=20.0, what="sim-2 serving")
            # Removed while it streams: the answer comes once its streams are done.
            await eventually(lambda: sim2.in_flight > 0, what="streams open on sim-2")
            open_at_delete = sim2.in_flight
            loops = list(gw.runtime._replica_tasks["sim-2"])
            # Health checks, the score loop and the /load probe.
            assert len(loops) == 3 and not any(t.done() for t in loops)
            t0 = time.monotonic()
            r = await admin.delete("/admin/replicas/sim-2")
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["removed"] is True and body["outcome"] == "removed"
            assert body["in_flight"] == 0 and body["waited_s"] > 0
            assert time.monotonic() - t0 >= body["waited_s"]
            assert open_at_delete > 0 and sim2.in_flight == 0
            assert "sim-2" not in pool.replicas
            assert all(t.done() for t in loops)  # its health and score loops ended with it
            served = sim2.requests_total
            await load.wait_for(20)
            assert sim2.requests_total == served  # nothing reached the detached state
        load.check()
        names = [v["name"] for v in (await admin.get("/admin/replicas")).json()["replicas"]]
        assert names == ["sim-0", "sim-1"]
