"""Admin changes under `--workers 2`: real worker processes, every change reaches every worker.

Each request is a fresh connection, so the kernel picks the worker: the change is made through
whichever answers, and `GET /admin/replicas` (any worker) lists each worker's own figures.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.admin import changes
from gateway.admin.changes import Change
from gateway.admin.config import DiscoveryConfig
from gateway.admin.siblings import Siblings, change_request, tell
from gateway.config import ServerConfig, load_config
from gateway.process import running_gateway
from gateway.supervisor import running_workers
from gateway.workers import WorkerSlot
from simulator import SimFleet
from tests.gateway.admin.conftest import ADMIN_KEY, fleet_config
from tests.gateway.conftest import eventually
from tests.gateway.test_workers import _FALSE, _chat, _fresh

AUTH = {"authorization": f"Bearer {ADMIN_KEY}"}
BOTH_OK = {"0": "ok", "1": "ok"}


def _config(fleet: SimFleet, first: int = 2) -> Any:
    server = ServerConfig(port=0, drain_timeout_s=10.0, admin_keys=(ADMIN_KEY,))
    return fleet_config(
        fleet, first=first, server=server, discovery=DiscoveryConfig(slow_start=False)
    )


async def _admin(url: str, method: str, path: str, **kw: Any) -> httpx.Response:
    async with _fresh() as c:
        return await c.request(method, url + path, headers=AUTH, **kw)


async def _view(url: str) -> dict[str, dict[str, Any]]:
    """GET /admin/replicas from whichever worker answers: each replica's merged row."""
    r = await _admin(url, "GET", "/admin/replicas")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["workers_reporting"] == 2
    return {row["name"]: row for row in body["replicas"]}


def _per_worker(row: dict[str, Any], key: str) -> dict[str, Any]:
    return {w: figures[key] for w, figures in row["workers"].items()}


async def test_add_drain_undrain_remove_reach_every_worker_and_it_routes_accordingly(
    fleet3: SimFleet,
) -> None:
    async with running_workers(_config(fleet3), 2) as sup:
        sim2 = fleet3.replicas[2]
        r = await _admin(
            sup.url, "POST", "/admin/replicas", json={"url": sim2.url, "name": "sim-2"}
        )
        assert r.status_code == 201, r.text
        assert r.json()["workers"] == BOTH_OK
        assert await _chat(sup.url, 60) == [200] * 60
        row = (await _view(sup.url))["sim-2"]
        served = _per_worker(row, "requests_total")
        # Every worker routes to it (round robin over three: about a third of each one's).
        assert set(served) == {"0", "1"} and all(n > 0 for n in served.values()), served
        assert row["requests_total"] == sum(served.values())  # the top level is the sum

        r = await _admin(sup.url, "POST", "/admin/replicas/sim-2/drain")
        assert r.status_code == 200 and r.json()["workers"] == BOTH_OK, r.text
        view = await _view(sup.url)
        assert _per_worker(view["sim-2"], "drained") == {"0": True, "1": True}
        before = _per_worker(view["sim-2"], "requests_total")
        others = sum(view[n]["requests_total"] for n in ("sim-0", "sim-1"))
        assert await _chat(sup.url, 40) == [200] * 40
        view = await _view(sup.url)
        assert _per_worker(view["sim-2"], "requests_total") == before  # no worker sent one
        assert sum(view[n]["requests_total"] for n in ("sim-0", "sim-1")) == others + 40

        r = await _admin(sup.url, "POST", "/admin/replicas/sim-2/undrain")
        assert r.json()["workers"] == BOTH_OK
        view = await _view(sup.url)
        assert _per_worker(view["sim-2"], "routable") == {"0": True, "1": True}

        r = await _admin(sup.url, "DELETE", "/admin/replicas/sim-2")
        assert r.status_code == 200 and r.json()["removed"], r.text
        assert r.json()["workers"] == BOTH_OK
        assert "sim-2" not in await _view(sup.url)  # in neither worker
        assert await _chat(sup.url, 10) == [200] * 10


async def test_refused_changes_are_passed_on_to_no_worker(fleet3: SimFleet) -> None:
    async with running_workers(_config(fleet3), 2) as sup:
        sim2 = fleet3.replicas[2]
        async with _fresh() as c:  # no key
            r = await c.post(sup.url + "/admin/replicas", json={"url": sim2.url})
        assert r.status_code == 401
        bad = await _admin(sup.url, "POST", "/admin/replicas", json={"url": sim2.url, "wieght": 2})
        assert bad.status_code == 400 and "workers" not in bad.json(), bad.text
        taken = await _admin(
            sup.url, "POST", "/admin/replicas", json={"url": sim2.url, "name": "sim-0"}
        )
        assert taken.status_code == 409 and "workers" not in taken.json(), taken.text
        missing = await _admin(sup.url, "POST", "/admin/replicas/nope/drain")
        assert missing.status_code == 404 and "workers" not in missing.json()
        # With sim-1 drained (in both), sim-0 is the last routable one: a 409, not passed on.
        drained = await _admin(sup.url, "POST", "/admin/replicas/sim-1/drain")
        assert drained.json()["workers"] == BOTH_OK
        last = await _admin(sup.url, "DELETE", "/admin/replicas/sim-0")
        assert last.status_code == 409 and "workers" not in last.json(), last.text
        for _ in range(4):  # whichever worker answers: both unchanged
            view = await _view(sup.url)
            assert sorted(view) == ["sim-0", "sim-1"]
            assert _per_worker(view["sim-0"], "drained") == {"0": False, "1": False}
            assert _per_worker(view["sim-1"], "drained") == {"0": True, "1": True}


def _toml(fleet: SimFleet, names: list[str]) -> str:
    replicas = "".join(
        f'[[replicas]]\nname = "{r.name}"\nurl = "{r.url}"\n\n'
        for r in fleet.replicas
        if r.name in names
    )
    return (
        f'[server]\nport = 0\ndrain_timeout_s = 10.0\nadmin_keys = ["{ADMIN_KEY}"]\n\n'
        "[health_check]\ninterval_s = 0.1\ntimeout_s = 0.5\n\n"
        '[routing]\nprofile = "round_robin"\n\n[discovery]\nslow_start = false\n\n'
        f"{replicas}"
    )


async def test_reload_through_the_api_or_sighup_reloads_both_workers(
    fleet3: SimFleet, tmp_path: Path
) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(_toml(fleet3, ["sim-0", "sim-1"]))
    async with running_workers(load_config(path), 2, config_path=str(path)) as sup:
        path.write_text(_toml(fleet3, ["sim-0", "sim-2"]))
        r = await _admin(sup.url, "POST", "/admin/reload")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["workers"] == BOTH_OK
        assert body["replicas"]["added"] == ["sim-2"] and body["replicas"]["removed"] == ["sim-1"]
        view = await _view(sup.url)
        assert sorted(view) == ["sim-0", "sim-2"]
        assert set(view["sim-2"]["workers"]) == {"0", "1"}
        # A file that fails validation: refused by the answering worker, passed on to none.
        path.write_text(_toml(fleet3, ["sim-1"]) + "[server.bogus]\n")
        bad = await _admin(sup.url, "POST", "/admin/reload")
        assert bad.status_code == 400 and "workers" not in bad.json(), bad.text
        assert sorted(await _view(sup.url)) == ["sim-0", "sim-2"]
        # SIGHUP's path: the supervisor hands the reload to each worker over its socket.
        path.write_text(_toml(fleet3, ["sim-1", "sim-2"]))
        sup.reload()

        async def reloaded() -> bool:
            view = await _view(sup.url)
            return sorted(view) == ["sim-1", "sim-2"] and all(
                set(row["workers"]) == {"0", "1"} for row in view.values()
            )

        deadline = asyncio.get_running_loop().time() + 15.0
        while not await reloaded():
            assert asyncio.get_running_loop().time() < deadline, await _view(sup.url)
            await asyncio.sleep(0.05)


async def test_a_worker_down_during_a_change_is_reported_and_replays_it_when_restarted(
    fleet3: SimFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_workers(_config(fleet3), 2) as sup:
        victim = sup.pids()[1]
        assert victim
        monkeypatch.setattr(sys, "executable", _FALSE)  # its restarts fail until undone
        os.kill(victim, signal.SIGKILL)
        await eventually(lambda: sup.restarts[1] >= 1, 10, "a failed restart")
        sim2 = fleet3.replicas[2]
        r = await _admin(
            sup.url, "POST", "/admin/replicas", json={"url": sim2.url, "name": "sim-2"}
        )
        assert r.status_code == 201, r.text
        workers = r.json()["workers"]
        assert workers["0"] == "ok" and workers["1"].startswith("error: unreachable"), workers
        r = await _admin(sup.url, "POST", "/admin/replicas/sim-0/drain")
        assert r.json()["workers"]["1"].startswith("error: unreachable")
        monkeypatch.undo()
        await eventually(lambda: sup.pids()[1] not in (None, victim), 20, "a restart that serves")
        # It started from the config and replayed both changes before it served.
        view = await _view(sup.url)
        assert set(view["sim-2"]["workers"]) == {"0", "1"}
        assert _per_worker(view["sim-0"], "drained") == {"0": True, "1": True}
        assert await _chat(sup.url, 60) == [200] * 60
        view = await _view(sup.url)
        assert all(n > 0 for n in _per_worker(view["sim-2"], "requests_total").values())
        assert _per_worker(view["sim-0"], "requests_total") == {"0": 0, "1": 0}


@pytest.fixture
def channel() -> Iterator[str]:
    # Short: a unix socket's path must fit in 108 bytes.
    path = tempfile.mkdtemp(prefix="gw-")
    try:
        yield path
    finally:
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)


async def test_a_change_reaching_a_starting_worker_twice_is_applied_once(
    fleet3: SimFleet, channel: str
) -> None:
    async with running_gateway(_config(fleet3)) as gw:
        slot = WorkerSlot(index=1, count=2, restarts=1, channel_dir=channel, http_port=0)
        siblings = Siblings(slot, gw.runtime)
        await siblings.start()
        try:
            sim2 = fleet3.replicas[2]
            change = Change("add", replica={"url": sim2.url, "name": "sim-2"})
            offset = changes.append(channel, change)
            request = change_request(offset, change)
            # Handed over while the worker starts: held until the replay has run.
            told = asyncio.create_task(tell(slot.socket_path(1), request, 10))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(told), 0.3)
            assert "sim-2" not in gw.runtime.pool.replicas
            await siblings.replay()
            assert await told == "ok"
            # Handed over again (journaled, and sent): the replay's add, not a second's 409.
            assert await tell(slot.socket_path(1), request, 10) == "ok"
            assert [r.name for r in gw.runtime.pool] == ["sim-0", "sim-1", "sim-2"]
            # A change journaled after the replay is applied when handed over, once.
            drain = Change("drain", "sim-2")
            offset = changes.append(channel, drain)
            assert await tell(slot.socket_path(1), change_request(offset, drain), 10) == "ok"
            assert gw.runtime.pool["sim-2"].drained
            assert [o for o, _ in changes.read(channel)] == [0, offset]
            bogus = Change("remove", "nope")
            offset = changes.append(channel, bogus)
            answer = await tell(slot.socket_path(1), change_request(offset, bogus), 10)
            assert answer == "error: no replica named 'nope'"
        finally:
            await siblings.close()


def test_a_change_names_a_known_operation() -> None:
    assert Change.decode(Change("remove", "r", force=True, wait_s=1.5).encode()) == Change(
        "remove", "r", force=True, wait_s=1.5
    )
    with pytest.raises(ValueError, match="unknown admin change"):
        Change.decode(b'{"op": "explode"}')
    with pytest.raises(TypeError):
        Change.decode(b'{"op": "drain", "nmae": "x"}')
