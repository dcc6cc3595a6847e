"""The replay client on real sockets: records, and probing a router until it routes."""

from dataclasses import dataclass, field

import aiohttp
import pytest

from benchmarks.replay import client as replay_client
from benchmarks.replay.client import Client, short_request, until_routing
from benchmarks.replay.contenders import Direct
from benchmarks.replay.loop import Record
from benchmarks.replay.workloads import Item
from benchmarks.routing_bench.contenders import FleetInfo
from benchmarks.routing_bench.runner import RunError
from simulator import SimFleet
from simulator.config import SimConfig

MODEL = SimConfig().model


@dataclass
class _OneReplica:
    """A stand-in router that sends everything to one replica (and so reaches only it)."""

    url: str
    name: str = "router:one"
    headers: dict[str, str] = field(default_factory=dict)

    async def start(self, fleet: FleetInfo) -> str:
        return self.url

    async def stop(self) -> None:
        return None

    def pids(self) -> list[int]:
        return []


class _Healing(Client):
    """Clears the replica's faults after its third request."""

    sent = 0

    async def send(self, item: Item) -> Record:
        rec = await super().send(item)
        self.sent += 1
        if self.sent == 3:
            await _faults(self.session, self.base, error_rate=0.0)
        return rec


async def _faults(session: aiohttp.ClientSession, url: str, **faults: object) -> None:
    async with session.post(f"{url}/_sim/faults", json=faults) as resp:
        assert resp.status == 200


async def test_records_carry_the_answer_or_the_error() -> None:
    async with SimFleet(SimConfig(), replicas=1) as fleet, aiohttp.ClientSession() as s:
        one = _OneReplica(fleet.urls[0])
        c = Client(s, MODEL, one, one.url)
        rec = await c.send(short_request("t", 0))
        assert rec["status"] == 200 and rec["error"] is None and rec["tokens"] == 4
        assert rec["prompt_tokens"] > 0 and rec["ttft"] > 0 and rec["ended"] >= rec["sent"]
        await _faults(s, one.url, error_rate=1.0, error_status=503)
        rec = await c.send(short_request("t", 1))
        assert rec["status"] == 503 and rec["error"]
        gone = Client(s, MODEL, one, "http://127.0.0.1:9")  # nothing listens there
        rec = await gone.send(short_request("t", 2))
        assert rec["status"] == 0 and "ClientConnectorError" in rec["error"]


async def test_probes_go_on_until_the_router_answers_then_stop() -> None:
    async with SimFleet(SimConfig(), replicas=1) as fleet, aiohttp.ClientSession() as s:
        one = _OneReplica(fleet.urls[0])
        c = Client(s, MODEL, one, one.url)
        assert (await until_routing(c))[0] == 1  # answered at once: one probe, no more
        # Three 503s, then the replica heals: it keeps probing, then stops at the answer.
        await _faults(s, one.url, error_rate=1.0, error_status=503)
        probes, seconds = await until_routing(_Healing(s, MODEL, one, one.url))
        assert probes == 4 and seconds > 0
        direct = Direct()
        await direct.start(FleetInfo(tuple(fleet.urls), MODEL, (None,), None, 16, "sim"))
        assert await until_routing(Client(s, MODEL, direct, "")) == (0, 0.0)


async def test_a_router_that_never_answers_fails_after_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replay_client, "READY_TIMEOUT_S", 0.5)
    async with SimFleet(SimConfig(), replicas=1) as fleet, aiohttp.ClientSession() as s:
        one = _OneReplica(fleet.urls[0])
        await _faults(s, one.url, error_rate=1.0, error_status=503)
        with pytest.raises(RunError, match="answered no probe"):
            await until_routing(Client(s, MODEL, one, one.url))
