"""One process's outlier ejection reaches the others: a failing replica is out everywhere."""

from __future__ import annotations

import logging

import pytest

from gateway.replicas.outlier import Ejection
from gateway.shared_state.mirror import decode, encode
from simulator import SimFleet
from tests.gateway.conftest import eventually, set_faults
from tests.gateway.shared_state.conftest import gateways, shared_config
from tests.gateway.shared_state.helpers import chat
from tests.redis_server import RedisServer


async def test_an_ejection_in_one_process_ejects_the_replica_in_the_others(
    fleet4: SimFleet, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "llm_gateway.outlier")
    bad = fleet4.replicas[0]
    await set_faults(bad.url, error_rate=1.0)
    async with gateways(shared_config(fleet4, redis_server)) as (a, b):
        name = next(r.name for r in a.runtime.pool if r.config.url == bad.url)
        for i in range(40):  # retried elsewhere: every client gets its answer
            resp = await a.client.post("/v1/chat/completions", json=chat(f"s{i}", 1))
            assert resp.status_code == 200, resp.text
            if a.runtime.pool.outlier.ejected(name):
                break
        assert a.runtime.pool.outlier.ejected(name)
        # B never sent it a request: it learns the ejection from A.
        assert b.runtime.pool.replicas[name].requests_total == 0
        await eventually(lambda: b.runtime.pool.outlier.ejected(name), what="peer ejection")
        assert not b.runtime.pool.replicas[name].healthy
        for i in range(8):
            resp = await b.client.post("/v1/chat/completions", json=chat(f"b{i}", 1))
            assert resp.status_code == 200
        assert b.runtime.pool.replicas[name].requests_total == 0
    peer = [r.getMessage() for r in caplog.records if "a peer gateway's" in r.getMessage()]
    assert len(peer) == 1 and name in peer[0], peer


def test_ejections_on_the_wire_round_trip_and_malformed_ones_are_refused() -> None:
    ejection = Ejection("sim-1", "consecutive_failures", 30.0, 123.0, 2)
    origin, outcomes, ejections = decode(encode("p", [], [ejection]))
    assert (origin, outcomes) == ("p", [])
    assert ejections == [Ejection("sim-1", "consecutive_failures", 30.0, 0.0, 2)]
    assert decode(encode("p", []))[2] == []
    for bad in (b'{"o":"p","e":[],"j":[["sim-1","x",-1,1]]}', b'{"o":"p","e":[],"j":[[1]]}'):
        with pytest.raises(ValueError):
            decode(bad)
