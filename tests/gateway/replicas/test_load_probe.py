"""vLLM's /load between scrapes: other clients' load reaches the router, the gateway's never."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import aiohttp
import httpx
import pytest

from gateway.config import ReplicaConfig, RoutingConfig, ScoreLoopConfig
from gateway.replicas.load_probe import LoadProbe, Reading, foreign, server_load
from gateway.replicas.state import ReplicaState
from routing import PluginSpec, ProfileSpec
from simulator import SimFleet
from tests.gateway.conftest import (
    SIM,
    STORY,
    eventually,
    gateway_config,
    hold,
    holding,
    in_process,
    set_faults,
)

# Scrapes out of the picture (one at start, the next a minute later): what the router sees of
# another client's load between them comes from /load alone.
PROBED = ScoreLoopConfig(
    scrape_interval_s=60.0,
    steady_scrape_interval_s=60.0,
    idle_scrape_interval_s=60.0,
    stale_after_s=60.0,
    load_interval_s=0.02,
    load_timeout_s=0.2,
)
LEAST = RoutingConfig(
    profile="least",
    profiles={
        "least": ProfileSpec(
            picker=PluginSpec("max_score"),
            filters=(PluginSpec("healthy"), PluginSpec("serves_model")),
            scorers=(PluginSpec("least_inflight"),),
            affinity=(),
            name="least",
        )
    },
)


@contextlib.asynccontextmanager
async def _slow_fleet() -> AsyncIterator[SimFleet]:
    # Real-time clock: a held stream of 4000 tokens lasts half a minute, longer than any test.
    async with SimFleet(
        replace(SIM, time_scale=1.0), replicas=2, host="127.0.0.1", base_port=0
    ) as f:
        yield f


def test_foreign_load_needs_two_reads_that_agree() -> None:
    assert foreign(None, Reading(5, 0)) == 0
    assert foreign(Reading(3, 1), Reading(5, 1)) == 2
    # One read alone (a request of ours not counted yet, or one ended still counted) is noise.
    assert foreign(Reading(1, 1), Reading(4, 1)) == 0
    assert foreign(Reading(4, 4), Reading(2, 3)) == 0


def test_a_load_answer_without_a_count_is_not_vllms() -> None:
    assert server_load(b'{"server_load": 3}') == 3
    for body in (b'{"detail": "Not Found"}', b"<html>", b'{"server_load": true}', b"[1]"):
        assert server_load(body) is None


async def test_requests_sent_straight_to_a_replica_steer_the_gateway_away() -> None:
    async with _slow_fleet() as fleet:
        busy, other = fleet.replicas
        cfg = gateway_config(fleet, score_loop=PROBED, routing=LEAST)
        release = asyncio.Event()
        async with in_process(cfg) as gw, httpx.AsyncClient(base_url=busy.url) as direct:
            pool = gw.runtime.pool
            # A gateway that routes reads every replica at the fast cadence, idle ones too.
            assert (await gw.client.post("/v1/chat/completions", json=STORY)).status_code == 200
            before = {r.name: r.requests_total for r in pool}
            holds = [asyncio.create_task(hold(direct, holding(4000), release)) for _ in range(3)]
            await eventually(lambda: busy.inflight == 3, what="three direct streams")
            await eventually(
                lambda: pool[busy.name].foreign_in_flight == 3, what="foreign load seen"
            )
            snaps = {s.name: s for s in pool.snapshots()}
            assert snaps[busy.name].in_flight == 3
            assert snaps[other.name].in_flight == 0
            assert pool[busy.name].scrapes_total == 1  # the start's only: /load told it
            for _ in range(4):
                r = await gw.client.post("/v1/chat/completions", json=STORY)
                assert r.status_code == 200
            assert pool[other.name].requests_total == before[other.name] + 4
            assert pool[busy.name].requests_total == before[busy.name]
            text = (await gw.client.get("/metrics")).text
            assert f'llm_gateway_replica_foreign_in_flight{{replica="{busy.name}"}} 3.0' in text
            assert f'llm_gateway_replica_load_probes_total{{replica="{busy.name}"}}' in text
            release.set()
            await asyncio.gather(*holds)
            await eventually(
                lambda: pool[busy.name].foreign_in_flight == 0, what="foreign load gone"
            )


async def test_without_the_probe_the_gateway_sees_only_its_own_load() -> None:
    async with _slow_fleet() as fleet:
        busy = fleet.replicas[0]
        cfg = gateway_config(fleet, score_loop=replace(PROBED, load_interval_s=0.0))
        release = asyncio.Event()
        async with in_process(cfg) as gw, httpx.AsyncClient(base_url=busy.url) as direct:
            held = asyncio.create_task(hold(direct, holding(4000), release))
            await eventually(lambda: busy.inflight == 1, what="a direct stream")
            assert all(s.in_flight == 0 for s in gw.runtime.pool.snapshots())
            assert gw.runtime.pool[busy.name].load_probes_total == 0
            release.set()
            await held


async def test_the_gateways_own_requests_never_count_as_foreign(fleet: SimFleet) -> None:
    async with in_process(gateway_config(fleet, score_loop=PROBED, routing=LEAST)) as gw:
        pool = gw.runtime.pool
        seen: list[int] = []
        stop = asyncio.Event()

        async def client() -> None:
            # Short requests back to back: arrivals and departures between every two reads.
            while not stop.is_set():
                r = await gw.client.post("/v1/chat/completions", json=STORY)
                assert r.status_code == 200

        clients = [asyncio.create_task(client()) for _ in range(8)]
        start = {r.name: r.load_probes_total for r in pool}

        def read_enough() -> bool:
            seen.extend(r.foreign_in_flight for r in pool)
            return all(r.load_probes_total >= start[r.name] + 40 for r in pool)

        await eventually(read_enough, timeout=10.0, what="40 reads of each replica")
        stop.set()
        await asyncio.gather(*clients)
        assert all(r.requests_total > 0 for r in pool)
        assert max(seen) == 0


async def test_a_replica_without_load_tracking_is_probed_no_further(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "llm_gateway.load_probe")
    async with SimFleet(SIM, replicas=3, host="127.0.0.1", base_port=0) as fleet:
        untracked, absent, clock = fleet.replicas
        await set_faults(untracked.url, load_untracked=True)  # vLLM 0.32 without the flag
        await set_faults(absent.url, load_absent=True)  # a build without /load: 404
        async with in_process(gateway_config(fleet, score_loop=PROBED, routing=LEAST)) as gw:
            pool, loads = gw.runtime.pool, gw.runtime.loads
            await eventually(lambda: loads.untracked(absent.name), what="404 noticed")
            assert pool[absent.name].load_probes_total == 1
            # Answers of 0 prove nothing until the gateway's own requests go unseen there:
            # one stream on each replica (least in flight first).
            release = asyncio.Event()
            body = holding(4000)
            holds = [asyncio.create_task(hold(gw.client, body, release)) for _ in range(3)]
            await eventually(lambda: all(r.inflight == 1 for r in fleet.replicas), what="spread")
            await eventually(lambda: loads.untracked(untracked.name), what="zeros noticed")
            release.set()
            await asyncio.gather(*holds)
            # The tracked replica, routed to lately, is read every 20 ms: the others' clock.
            frozen = {r.name: r.load_probes_total for r in pool}
            await set_faults(absent.url, load_absent=False)
            await eventually(
                lambda: pool[clock.name].load_probes_total >= frozen[clock.name] + 20,
                what="20 reads of the tracked replica",
            )
            assert pool[absent.name].load_probes_total == frozen[absent.name]
            assert pool[untracked.name].load_probes_total == frozen[untracked.name]
            # A health flap: the replica may be back with other flags, so it is asked again.
            await set_faults(absent.url, unhealthy=True)
            await eventually(lambda: pool[absent.name].probe_down, what="down")
            await set_faults(absent.url, unhealthy=False)
            await eventually(
                lambda: pool[absent.name].load_probes_total >= frozen[absent.name] + 5,
                what="probed again after the flap",
            )
            assert not loads.untracked(absent.name)
            assert loads.untracked(untracked.name)
            assert pool[untracked.name].load_probes_total == frozen[untracked.name]
            assert pool[untracked.name].foreign_in_flight == 0
    # Logged once each, though the flapped replica was found without tracking only once.
    told = [r.getMessage() for r in caplog.records if "not probing its /load" in r.getMessage()]
    assert sorted(m.split(":")[0] for m in told) == sorted(
        [f"replica {untracked.name}", f"replica {absent.name}"]
    )


@contextlib.contextmanager
def _silent_server() -> Iterator[str]:
    """A real listener that never accepts: the kernel completes each handshake, nobody answers.

    Nothing on the event loop owns these connections, so none can outlive the test's loop
    (a stream server's accepted connection may not have reached its handler when the test ends).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


async def test_a_load_read_that_times_out_stalls_nothing() -> None:
    cfg = ScoreLoopConfig(load_interval_s=0.01, load_timeout_s=0.05)
    with _silent_server() as url:
        async with aiohttp.ClientSession() as session:
            replica = ReplicaState(ReplicaConfig(url=url, name="silent"))
            replica.in_flight = 1  # busy: read at the fast cadence
            replica.foreign_in_flight = 2  # as if earlier reads had agreed on two
            probe = LoadProbe(cfg, session)
            started = time.monotonic()
            assert await probe.read(replica) is None
            assert time.monotonic() - started < 1.0
            assert replica.foreign_in_flight == 0  # no read backs it any more
            task = asyncio.create_task(probe.run(replica))
            ticks = 0

            def reads_and_ticks() -> bool:
                nonlocal ticks
                ticks += 1  # the event loop runs between reads: nothing waits on the silent one
                return replica.load_probes_total >= 6

            await eventually(reads_and_ticks, what="reads timing out one after another")
            assert ticks > 1
            assert not probe.untracked("silent")  # a timeout is no answer, not a missing route
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert "silent" not in probe._probes  # a removed replica's record goes with its task
